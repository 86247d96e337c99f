"""Endpoint sources beyond static flags: the runtime admin API and its readiness wait,
and Kubernetes InferencePool discovery."""
