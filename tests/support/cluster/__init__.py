"""A local Kubernetes cluster from real components (see cluster.py), for the cluster test tier."""
