"""`python -m tests.support.cluster up|down|status`: what `make cluster` and `make cluster-down` run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.support.cluster import processes
from tests.support.cluster.cluster import Cluster, ClusterError, default_directory


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.cluster")
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--dir", type=Path, default=default_directory())
    parser.add_argument("--no-kueue", action="store_true", help="start without Kueue's manager")
    args = parser.parse_args()
    if args.action == "down":
        Cluster.down(args.dir)
        print(f"stopped the cluster in {args.dir}")
        return 0
    if args.action == "status":
        running = processes.running(args.dir)
        for name, pid in sorted(running.items()):
            print(f"{name:<26} pid {pid}")
        return 0 if running else 1
    try:
        cluster = Cluster.up(args.dir, with_kueue=not args.no_kueue)
    except ClusterError as e:
        print(f"cluster failed to start: {e}", file=sys.stderr)
        return 1
    kubeconfig = args.dir.resolve() / "kubeconfig"
    print(
        f"cluster is up: Kubernetes {cluster.kubernetes_version}, KubeRay {cluster.kuberay_version}, "
        f"Kueue {cluster.kueue_version}, fake nodes from kwok (no container runs).\n"
        f"  export KUBECONFIG={kubeconfig}\n"
        f"  export PATH={args.dir.resolve() / 'bin'}:$PATH   # kubectl, helm, kwokctl\n"
        f"  kubectl get nodes\n"
        f"  make cluster-down        # stops every process; logs are in {args.dir.resolve()}/logs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
