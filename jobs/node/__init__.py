"""The code that runs on a node, inside `manage.py node_agent`: one process
per node that launches the node's task containers and follows them. The web
process never imports it (it reads logs with jobs/logs.py); the browser
terminal uses only the engine interface in launcher/.

    agent.py      NodeAgent: registers the node, heartbeats, serves its RQ
                  queue, reconciles the database with the engine; owns the
                  watchers. The only module here that knows NodeAgent.
    context.py    NodeContext (node, engine, engine CPUs, log writer,
                  log follower, watchers) and the Watchers registry: all the runner and
                  the watchers get from the agent.
    runner.py     Runner: launch and stop one task attempt.
    watcher.py    TaskWatcher: follow a container's two log streams, record
                  its exit, upload its outputs, clean up.
    follower.py   LogFollower: one thread that reads every container's log
                  socket (epoll), and the few helper threads that run the
                  watchers' blocking steps.
    staging.py    stage folders, codeDir staging, /pai/output upload.
    webforward.py WebForwarder: the portal's way to tasks' web ports (signed
                  connections only, spliced to the node's loopback).
    logwriter.py  LineAssembler and LogWriter: log lines and platform notes
                  written in batches with a resume cursor per stream.
    launcher/     the engine interface and its registry; launcher/docker.py
                  is the only module of the project that imports `docker`.

Imports flow one way: agent -> runner, watcher -> context, follower, staging,
logwriter, launcher. Only jobs/tasks.py (to reach `agent.current()`) and the
node_agent command import agent.py.
"""
