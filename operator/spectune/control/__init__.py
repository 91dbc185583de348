"""One tuning step over ports: observe, record, decide, apply, watch. No kopf, no k8s client."""
