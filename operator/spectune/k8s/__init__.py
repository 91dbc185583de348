"""Kubernetes objects and calls: Deployment builders, rollout readiness, the actuator.

The only layer (with ``handlers.py``) that knows Kubernetes; the kubernetes client is
imported here and nowhere in the brain.
"""
