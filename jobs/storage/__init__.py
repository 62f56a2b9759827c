"""Storage for code, data and output: the only package that imports `hdfs`.

CONTRACT (used by jobs/services.py and jobs/runner.py; keep these names):

    class StorageError(Exception)            # message is shown to users as is
    class StorageAccessDenied(StorageError)
    class StorageNotFound(StorageError)

    def check_job_paths(*, user_name: str, is_admin: bool, spec: JobSpec) -> list[tuple[str, str]]
        For codeDir, dataDir, outputDir and authFile of the spec: a list of
        (field name, message) for each one the user may not use (wrong scheme,
        `..` escapes, another user's home, host paths ...). Empty list = fine.
    def ensure_output_dir(*, user_name: str, uri: str) -> None
        Create outputDir when missing (raises StorageError).
    def stage_tree(uri: str, dest: pathlib.Path, *, max_bytes: int) -> int
        Copy the folder at `uri` into local folder `dest` (created), refusing
        with StorageError once more than `max_bytes` would be copied. Returns bytes copied.
    def upload_tree(src: pathlib.Path, uri: str) -> int
        Copy a local folder's contents into `uri` (created). Returns bytes copied.
    def read_small_file(uri: str, *, max_bytes: int) -> bytes

This placeholder is replaced by the full implementation (local disk + WebHDFS).
"""
