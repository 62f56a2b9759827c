"""A task's image on a node: where the engine may be sent for it, and who
may start an image the node already has.

Registry addresses (finding 15, node side): before the engine is sent to a
registry (a pull, or a check below), the registry's host name is resolved
here and the launch refused if it points at the node itself, a link-local
address (cloud metadata) or, unless REGISTRY_ALLOWED opens it, a private
address. Submission checked the name as written (jobs/services/admission.py);
only the node can check what it resolves to. Docker resolves the name again
when it connects: a name that changes its answer in between is not caught.
Docker Hub is not resolved: it is Docker's fixed default. A name that does
not resolve reads the same either way (registries.py): no such name fails
at once, no answer from the DNS is waited for as an unreachable registry.

Private images (finding 6): an image pulled with one job's credentials stays
on the node, where the engine would start it for anyone. A job may use an
image that needs credentials only if its own credentials can pull it (as with
Kubernetes' AlwaysPullImages), without that cost for public images:

- a job with an authFile whose image is on the node: its registry is asked
  at each launch, with those credentials (a manifest inspect, no download);
- a job without one, whose image's repository was pulled with credentials
  on this engine and is refused without them: asked without credentials at
  each launch, which refuses it;
- a job without one, whose image came from a registry (the engine has a
  digest of it) that is not known to let anyone pull it: asked without
  credentials, and the answer kept (finding 34: the records below can be
  lost while the engine keeps its images, and an image may have been pulled
  by an older version or another host's agent);
- anything else (public images asked about once, the local pai-local/...
  images, which have no registry): started as it is, with no round trip.

Before every pull the registry is asked the same way, so that a refusal
reads the same whether or not the node has the image (finding 35): the node
having it says that another user's job pulled it.

Which repositories needed credentials, and which did not, is kept per portal
instance and engine in two files (RepositoryRecord), which the agents of the
engine's host share.

A pull that gets no news from the engine for IMAGE_PULL_STALL_SECONDS is
given up (finding 30): a registry that stops sending mid-download would
otherwise hold the pull, and the launch thread waiting for it, for good. So
is one whose new layers pass IMAGE_PULL_MAX_MB (finding 32): an enormous
image filled the disk the node's other tasks write to; and one still under
way after IMAGE_PULL_MAX_SECONDS (finding 33): a registry that trickles. A
pulled image that unpacks past IMAGE_MAX_UNPACKED_MB (a gzip bomb, under
the compressed limit) is refused and removed (Engine.ensure_image); an
image already on the engine is not checked again, as its pull was. As
that comes once the image is on the disk, a pull is also given up once
the engine's disk has less than IMAGE_PULL_MIN_FREE_MB free.

A check or pull not over within ASIDE_AFTER_SECONDS goes on on a thread of
its own, its launch set aside off the node's launch threads and handed back
when it ends (finding 47): two users' pulls held all of them. A registry that
cannot be reached (refused, timed out, 5xx: RegistryUnreachable) is asked
again with backoff for IMAGE_PULL_REGISTRY_WAIT_SECONDS, the launch set
aside meanwhile and nothing started, then the task fails (finding 46); a
refusal fails at once. So is a pull the registry broke off half-way (the
engine's connection reset or timed out: PullInterrupted), pulled again;
not a pull given up by the limits above, which are the node's own.

A pull's progress (PullRecord) goes to the database for the job page: at
its start, then at most every PROGRESS_INTERVAL seconds (a pull sends
several events per layer per second), and at its end with any error.
"""

from jobs.node.images.gate import ImageGate, LaunchSetAside, PullDeferred
from jobs.node.images.records import PROGRESS_INTERVAL, PullRecord, RepositoryRecord
from jobs.node.images.registries import node_registry_refusal, resolve_host
from jobs.node.images.slots import PullSlots

__all__ = ["ImageGate", "LaunchSetAside", "PROGRESS_INTERVAL", "PullDeferred", "PullRecord", "PullSlots",
           "RepositoryRecord", "node_registry_refusal", "resolve_host"]
