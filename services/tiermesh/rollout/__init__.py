"""Canary rollouts: which version serves a request, what the gateways observed of each
version, the judgement of a canary, and the changes `tiermesh rollout` makes.

Pure decisions (split, window, judge, drift, state transitions, changes) import no Redis
and no gRPC; store.py does the Redis I/O; cache, controller and recorder are the loops."""
