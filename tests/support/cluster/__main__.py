"""`python -m tests.support.cluster up|down|status|load-image`: what `make cluster` and
`make cluster-down` run; `load-image FILE...` imports OCI archives into the real node. `up` also
loads the operator and trainer images `make images` built, under the names the chart defaults
to, so the README's `helm install` and `kubectl apply` run there as written."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hack import images as built
from tests.support.cluster import processes
from tests.support.cluster.cluster import Cluster, ClusterError, default_directory


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.cluster")
    parser.add_argument("action", choices=["up", "down", "status", "load-image"])
    parser.add_argument("files", nargs="*", type=Path, help="load-image: OCI image-layout tars")
    parser.add_argument("--dir", type=Path, default=default_directory())
    parser.add_argument("--no-kueue", action="store_true", help="start without Kueue's manager")
    parser.add_argument(
        "--no-real-node", action="store_true", help="only kwok's fake nodes (no containerd, kubelet)"
    )
    args = parser.parse_intermixed_args()
    if args.action == "down":
        Cluster.down(args.dir)
        print(f"stopped the cluster in {args.dir}")
        return 0
    if args.action == "status":
        running = processes.running(args.dir)
        for name, pid in sorted(running.items()):
            print(f"{name:<26} pid {pid}")
        return 0 if running else 1
    if args.action == "load-image":
        cluster = Cluster.load(args.dir)
        if missing := [str(f) for f in args.files if not f.is_file()]:
            print(f"no such archive: {', '.join(missing)}", file=sys.stderr)
            return 1
        for archive in args.files:
            started = time.monotonic()
            done = "loaded" if cluster.load_image(archive) else "already there:"
            print(f"{done} {archive} ({time.monotonic() - started:.1f} s)")
        return 0
    try:
        cluster = Cluster.up(args.dir, with_kueue=not args.no_kueue, real_node=not args.no_real_node)
    except ClusterError as e:
        print(f"cluster failed to start: {e}", file=sys.stderr)
        return 1
    if cluster.real_node:
        for name in built.IMAGES:
            started = time.monotonic()
            archive = built.ensure(name)
            cluster.load_image(archive, aliases=[built.published_ref(name)])
            took = time.monotonic() - started
            print(f"image {built.published_ref(name)} ({archive.name}) ready in {took:.0f} s")
    kubeconfig = args.dir.resolve() / "kubeconfig"
    nodes = (
        "a real node (real-node-0: containerd, kubelet; label llmtrain.dev/real-node=true) and "
        "kwok's fake GPU and CPU nodes"
        if cluster.real_node
        else "fake nodes from kwok (no container runs)"
    )
    print(
        f"cluster is up: Kubernetes {cluster.kubernetes_version}, KubeRay {cluster.kuberay_version}, "
        f"{'no Kueue' if args.no_kueue else f'Kueue {cluster.kueue_version}'}, {nodes}.\n"
        f"  export KUBECONFIG={kubeconfig}\n"
        f"  export PATH={args.dir.resolve() / 'bin'}:$PATH   # kubectl, helm, kwokctl, ctr\n"
        f"  kubectl get nodes\n"
        f"  python -m tests.support.cluster load-image --dir {args.dir} IMAGE.oci.tar\n"
        f"  make cluster-down        # stops every process; logs are in {args.dir.resolve()}/logs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
