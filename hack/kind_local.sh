#!/bin/bash
# kind on a machine without Docker or an image registry: Podman (Debian's) inside a network
# namespace of its own, kind's base image made from Debian packages (mmdebstrap) and the project's
# Go-built containerd, runc and CNI plugins, and `kind build node-image --type file` fed a
# Kubernetes release tarball made from the pinned k8s.io/kubernetes binaries, with every image
# kind would pull built here instead. tests/README.md ("kind") has what it took and the times.
#
# Usage (as root, from the repository root):
#   hack/kind_local.sh image   build kind, the base image, the release tarball and the node image
#   hack/kind_local.sh node-image   only the last step, from the base image and tarball there
#   hack/kind_local.sh up      create the cluster (kubectl only inside the namespace:
#                              nsenter --net=/run/netns/llmtrain-kind kubectl --kubeconfig $LLMTRAIN_CACHE/kind/kubeconfig)
#   hack/kind_local.sh down    delete the cluster and the network namespace
#   hack/kind_local.sh clean   down, then remove $LLMTRAIN_CACHE/kind (the Go tools, images and Podman's storage)
#   hack/kind_local.sh ensure  `image` unless the node image of this recipe and these pins is there
#   hack/kind_local.sh env     print the exports that run kind and Podman this way (for eval)
# No kindnetd (the Go module proxy does not serve it): the cluster runs with kind's default CNI
# disabled and a ptp + host-local conflist baked into the base image (one node: no routes).
# Environment: LLMTRAIN_CACHE (default ~/.cache/llmtrain), PYTHON (default .venv/bin/python),
# LLMTRAIN_KIND_CLUSTER (the cluster's name, default llmtrain-kind).
set -euo pipefail

KIND_VERSION=v0.33.0
CRICTL_VERSION=v1.36.0
CNI_VERSION=v1.10.0
K8S=v1.36.3
# The names kind v0.33's build and kubeadm 1.36 ask for (`kubeadm config images list`, kind's
# containerd sandbox_image and its CNI and storage manifests).
ETCD_IMAGE=registry.k8s.io/etcd:3.6.8-0
COREDNS_IMAGE=registry.k8s.io/coredns/coredns:v1.14.2
PAUSE_IMAGE=registry.k8s.io/pause:3.10
KINDNETD_IMAGE=docker.io/kindest/kindnetd:v20260820-69b56db7
PROVISIONER_IMAGE=docker.io/kindest/local-path-provisioner:v20260820-69b56db7
HELPER_IMAGE=docker.io/kindest/local-path-helper:v20260131-7181c60a

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${LLMTRAIN_CACHE:-$HOME/.cache/llmtrain}
W=$CACHE/kind
NETNS=llmtrain-kind
CLUSTER=${LLMTRAIN_KIND_CLUSTER:-llmtrain-kind}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
tool_dir() { PYTHONPATH=$ROOT/hack/tools "$PYTHON" "$ROOT/hack/tools/build_tools.py" --dir "$1"; }
export GOBIN=$W/bin PATH=$W/shim:$W/bin:$PATH
export CONTAINERS_STORAGE_CONF=$W/storage.conf CONTAINERS_CONF=$W/containers.conf
export KIND_EXPERIMENTAL_PROVIDER=podman
NICE=(nice -n 19 ionice -c3)
IN_NS=(nsenter "--net=/run/netns/$NETNS")

log() { printf '\n== %s (%(%T)T)\n' "$*" -1; }

setup() {
  command -v podman >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y podman
  for t in buildah mmdebstrap go; do command -v "$t" >/dev/null || { echo "missing $t" >&2; exit 1; }; done
  mkdir -p "$W"/{bin,shim,storage,run,netconf}
  local runc
  runc=$(tool_dir runc)/runc
  cat >"$W/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$W/storage"
runroot = "$W/run"
EOF
  # crun 1.8 refuses this hybrid cgroup host ("cgroups in hybrid mode not supported"); Podman's
  # default rlimits (nofile and nproc above the hard limits) need CAP_SYS_RESOURCE, which root
  # lacks here; no systemd runs on the host, so cgroupfs and a file for events. Podman's default
  # pids_limit (2048) holds every thread of a kind node: a Ray head's raylet then dies in
  # pthread_create (EAGAIN); Docker sets none.
  cat >"$W/containers.conf" <<EOF
[containers]
netns = "bridge"
pids_limit = 0
default_ulimits = ["nofile=20000:20000", "nproc=20000:20000"]
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$W/events.log"
runtime = "runc"
[engine.runtimes]
runc = ["$runc"]
[network]
network_config_dir = "$W/netconf"
EOF
  # kind build node-image runs `docker`; the base image is local, so its pull is a no-op.
  cat >"$W/shim/docker" <<'EOF'
#!/bin/bash
[ "$1" = pull ] && exit 0
exec podman "$@"
EOF
  chmod +x "$W/shim/docker"
  # kind mounts /lib/modules into each node; this kernel has none.
  mkdir -p /lib/modules
  if ! ip netns list | grep -qw "$NETNS"; then
    ip netns add "$NETNS"
    ip -n "$NETNS" link set lo up
  fi
}

build_tools() {
  log "Go tools: kind, crictl, ptp; the project's binaries (kubeadm among Kubernetes')"
  [ -x "$W/bin/kind" ] || "${NICE[@]}" go install "sigs.k8s.io/kind@$KIND_VERSION"
  [ -x "$W/bin/crictl" ] || "${NICE[@]}" go install "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
  [ -x "$W/bin/ptp" ] || "${NICE[@]}" go install "github.com/containernetworking/plugins/plugins/main/ptp@$CNI_VERSION"
  PYTHONPATH=$ROOT/hack/tools "${NICE[@]}" "$PYTHON" "$ROOT/hack/tools/build_tools.py" \
    containerd runc cni-plugins kubernetes etcd coredns local-path-provisioner >/dev/null
}

build_base() {
  log "kind's base image from Debian packages"
  local kind_src hook rootfs ctr containerd runc cni
  containerd=$(tool_dir containerd)
  runc=$(tool_dir runc)
  cni=$(tool_dir cni-plugins)
  kind_src=$(go env GOMODCACHE)/sigs.k8s.io/kind@$KIND_VERSION/images/base
  [ -d "$kind_src" ] || go mod download "sigs.k8s.io/kind@$KIND_VERSION"
  hook=$W/base-hook.sh
  rootfs=$W/base-rootfs.tar
  # What images/base/Dockerfile does, minus the fuse-overlayfs snapshotter (rootless only), NFS
  # and iSCSI clients; the containerd, runc and CNI plugins are the project's builds.
  cat >"$hook" <<EOF
#!/bin/bash
set -euo pipefail
r=\$1
F=$kind_src/files
install -m 0755 \$F/usr/local/bin/* \$r/usr/local/bin/
mkdir -p \$r/kind/bin \$r/etc/containerd \$r/etc/systemd/system/kubelet.service.d \$r/opt/cni/bin
cp -r \$F/kind/. \$r/kind/ && chmod 0644 \$r/kind/README.txt && chmod 0755 \$r/kind \$r/kind/bin \$r/kind/bin/*
install -m 0644 \$F/etc/crictl.yaml \$r/etc/
install -m 0644 \$F/etc/containerd/* \$r/etc/containerd/
install -m 0644 \$F/etc/default/* \$r/etc/default/
install -m 0644 \$F/etc/sysctl.d/* \$r/etc/sysctl.d/
install -m 0644 \$F/etc/systemd/system/*.service \$F/etc/systemd/system/*.slice \$r/etc/systemd/system/
install -m 0644 \$F/etc/systemd/system/kubelet.service.d/* \$r/etc/systemd/system/kubelet.service.d/
# no CAP_SYS_RESOURCE: no negative OOM scores, no rlimits above the hard limits
sed -i 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' \$r/etc/containerd/config.toml
sed -i '/^OOMScoreAdjust=/d; /^LimitNOFILE=/d; /^LimitNPROC=/d' \$r/etc/systemd/system/containerd.service
find \$r/lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete
rm -f \$r/lib/systemd/system/multi-user.target.wants/* \$r/etc/systemd/system/*.wants/* \\
  \$r/lib/systemd/system/local-fs.target.wants/* \$r/lib/systemd/system/sockets.target.wants/*udev* \\
  \$r/lib/systemd/system/sockets.target.wants/*initctl* \$r/lib/systemd/system/basic.target.wants/*
echo ReadKMsg=no >>\$r/etc/systemd/journald.conf
ln -sf /usr/lib/systemd/systemd \$r/sbin/init
install -m 0755 $containerd/{containerd,ctr,containerd-shim-runc-v2} $W/bin/crictl \$r/usr/local/bin/
install -m 0755 $runc/runc \$r/usr/local/sbin/runc
install -m 0755 $cni/{host-local,loopback,portmap} $W/bin/ptp \$r/opt/cni/bin/
# kindnetd's place: one node, so a ptp link per pod on kind's first pod range, no routes to others
mkdir -p \$r/etc/cni/net.d
cat >\$r/etc/cni/net.d/10-llmtrain.conflist <<'CNI'
{"cniVersion": "0.4.0", "name": "llmtrain", "plugins": [
  {"type": "ptp", "ipMasq": false, "mtu": 1500,
   "ipam": {"type": "host-local", "dataDir": "/run/cni-ipam-state",
            "ranges": [[{"subnet": "10.244.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
CNI
chroot \$r systemctl enable kubelet.service containerd.service undo-mount-hacks.service
chroot \$r systemctl mask systemd-binfmt.service
mkdir -p \$r/etc/kubernetes/manifests
chroot \$r /usr/local/bin/ctr oci spec \\
  | chroot \$r jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \\
  | chroot \$r jq 'del(.process.rlimits)' >\$r/etc/containerd/cri-base.json
rm -rf \$r/var/lib/apt/lists/* \$r/var/cache/apt/*
EOF
  chmod +x "$hook"
  "${NICE[@]}" mmdebstrap --quiet --variant=minbase \
    --include=systemd,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,e2fsprogs,bash,ca-certificates,curl,jq,procps \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --customize-hook="$hook \"\$1\"" bookworm "$rootfs" /etc/apt/sources.list.d/debian.sources
  ctr=$(buildah from scratch)
  buildah add --quiet "$ctr" "$rootfs" /
  buildah config --env container=docker --stop-signal SIGRTMIN+3 \
    --entrypoint '["/usr/local/bin/entrypoint", "/sbin/init"]' --cmd '' "$ctr"
  buildah commit --quiet --rm "$ctr" "$BASE_IMAGE" >/dev/null
  rm -f "$rootfs"
}

static_image() { # name binary [entrypoint]
  local c
  c=$(buildah from scratch)
  buildah copy --quiet --chmod 0755 "$c" "$2" "/usr/local/bin/$(basename "$2")"
  buildah config --env PATH=/usr/local/bin:/usr/bin:/bin ${3:+--entrypoint "$3"} "$c"
  buildah commit --quiet --rm "$c" "$1" >/dev/null
}

iptables_image() { # name binary entrypoint: on the base, for iptables, nft and conntrack
  local c
  c=$(buildah from "$BASE_IMAGE")
  buildah copy --quiet --chmod 0755 "$c" "$2" "/usr/local/bin/$(basename "$2")"
  buildah config --env container- --stop-signal SIGTERM --entrypoint "$3" --cmd '' "$c"
  buildah commit --quiet --rm "$c" "$1" >/dev/null
}

build_tarball() {
  log "the Kubernetes release tarball and the images kind would pull"
  local k8s t b pause busybox
  k8s=$(tool_dir kubernetes)
  t=$W/k8star
  b=$t/kubernetes/server/bin
  rm -rf "$t"
  mkdir -p "$b"
  echo "$K8S" >"$t/kubernetes/version"
  install -m 0755 "$k8s/kubeadm" "$k8s/kubelet" "$k8s/kubectl" "$b/"
  for x in kube-apiserver kube-controller-manager kube-scheduler; do
    static_image "registry.k8s.io/$x:$K8S" "$k8s/$x"
    podman save --format docker-archive -o "$b/$x.tar" "registry.k8s.io/$x:$K8S"
  done
  iptables_image "registry.k8s.io/kube-proxy:$K8S" "$k8s/kube-proxy" '["/usr/local/bin/kube-proxy"]'
  static_image "$ETCD_IMAGE" "$(tool_dir etcd)/etcd"
  static_image "$COREDNS_IMAGE" "$(tool_dir coredns)/coredns" '["/usr/local/bin/coredns"]'
  static_image "$PROVISIONER_IMAGE" "$(tool_dir local-path-provisioner)/local-path-provisioner"
  pause=$(cd "$ROOT" && PYTHONPATH=hack/tools "$PYTHON" -c 'from tests.support.cluster import images; print(images.pause_archive())')
  busybox=$(cd "$ROOT" && PYTHONPATH=hack/tools "$PYTHON" -c 'from tests.support.cluster import images; print(images.busybox_archive())')
  buildah tag "$(buildah pull --quiet "oci-archive:$pause")" "$PAUSE_IMAGE"
  # kind's build pulls its default CNI's image whatever the cluster's config; the clusters here
  # disable that CNI, so the pause image stands in under kindnetd's name.
  buildah tag "$PAUSE_IMAGE" "$KINDNETD_IMAGE"
  buildah tag "$(buildah pull --quiet "oci-archive:$busybox")" "$HELPER_IMAGE"
  podman save -m --format docker-archive -o "$t/proxy.tar" "registry.k8s.io/kube-proxy:$K8S" \
    "$ETCD_IMAGE" "$COREDNS_IMAGE" "$PAUSE_IMAGE" "$KINDNETD_IMAGE" "$PROVISIONER_IMAGE" "$HELPER_IMAGE"
  # kind takes as built (not to pull) the tags of manifest.json's first entry only, or every tag
  # of a `repositories` file when that comes first; containerd's import reads manifest.json.
  python3 - "$t/proxy.tar" "$b/kube-proxy.tar" <<'EOF'
import io, json, sys, tarfile
src, dst = sys.argv[1:]
with tarfile.open(src) as t:
    members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t.getmembers()]
manifest = json.loads(next(d for m, d in members if m.name == "manifest.json"))
repos = {}
for entry in manifest:
    for ref in entry["RepoTags"]:
        repo, tag = ref.rsplit(":", 1)
        repos.setdefault(repo, {})[tag] = entry["Layers"][-1].split("/")[0].removesuffix(".tar")
data = json.dumps(repos).encode()
with tarfile.open(dst, "w") as out:
    info = tarfile.TarInfo("repositories")
    info.size, info.mode = len(data), 0o644
    out.addfile(info, io.BytesIO(data))
    for m, d in members:
        if m.name != "repositories":
            out.addfile(m, io.BytesIO(d) if d is not None else None)
EOF
  rm -f "$t/proxy.tar"
  local gz=gzip
  command -v pigz >/dev/null && gz=pigz
  tar -C "$t" -cf - kubernetes | "${NICE[@]}" "$gz" -1 >"$W/kubernetes-server-linux-amd64.tar.gz"
  rm -rf "$t"
}

node_image() {
  log "kind build node-image"
  # kind leaves the tarball's 1.1 GB extract in its temporary folder
  rm -rf "$W/tmp"
  mkdir -p "$W/tmp"
  TMPDIR=$W/tmp "${NICE[@]}" "${IN_NS[@]}" kind build node-image --type file \
    "$W/kubernetes-server-linux-amd64.tar.gz" --base-image "$BASE_IMAGE" --image "$NODE_IMAGE"
  rm -rf "$W/tmp"
}

up() {
  log "kind create cluster"
  # A 2-core host: kubeadm's control plane asks for 650m CPU and CoreDNS for 2 x 100m, which leaves
  # too little beside the README's example (1.7 CPUs). The static pods ask for 10m each (kubeadm's
  # patches, mounted into the node), CoreDNS runs one replica at 10m.
  mkdir -p "$W/kubeadm-patches"
  local c
  for c in kube-apiserver kube-controller-manager kube-scheduler etcd; do
    printf 'spec:\n  containers:\n  - name: %s\n    resources:\n      requests:\n        cpu: 10m\n' "$c" \
      >"$W/kubeadm-patches/$c+strategic.yaml"
  done
  cat >"$W/kind-config.yaml" <<EOF
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking:
  ipFamily: ipv4
  disableDefaultCNI: true
nodes:
- role: control-plane
  extraMounts:
  - hostPath: $W/kubeadm-patches
    containerPath: /kind/llmtrain-patches
    readOnly: true
kubeadmConfigPatches:
- |
  kind: KubeletConfiguration
  failCgroupV1: false
- |
  kind: InitConfiguration
  patches:
    directory: /kind/llmtrain-patches
EOF
  "${NICE[@]}" "${IN_NS[@]}" kind create cluster --name "$CLUSTER" --image "$NODE_IMAGE" \
    --config "$W/kind-config.yaml" --kubeconfig "$W/kubeconfig" --wait 180s
  local kubectl=("${IN_NS[@]}" "$(tool_dir kubernetes)/kubectl" --kubeconfig "$W/kubeconfig" -n kube-system)
  # The node's resolv.conf is Podman's (search dns.podman, name servers nothing answers in the
  # namespace), and the pods' search lists end in dns.podman. CoreDNS forwarding there made each
  # lookup that walks the list wait for timeouts; without the forward a dns.podman name fails
  # with SERVFAIL, which stops gRPC's c-ares resolver (Ray's GCS client) before the name itself:
  # no forward, and dns.podman answered NXDOMAIN, so a lookup goes on to the next name at once.
  local corefile=$W/Corefile
  "${kubectl[@]}" get configmap coredns -o jsonpath='{.data.Corefile}' |
    sed '/forward \. \/etc\/resolv.conf/,/}/d' >"$corefile"
  printf 'dns.podman:53 {\n    template ANY ANY {\n        rcode NXDOMAIN\n    }\n}\n' >>"$corefile"
  "${kubectl[@]}" create configmap coredns --from-file=Corefile="$corefile" --dry-run=client -o yaml |
    "${kubectl[@]}" replace -f -
  "${kubectl[@]}" scale deployment/coredns --replicas=1
  "${kubectl[@]}" set resources deployment/coredns --requests=cpu=10m
}

down() {
  if ip netns list | grep -qw "$NETNS"; then
    "${IN_NS[@]}" kind delete cluster --name "$CLUSTER" --kubeconfig "$W/kubeconfig" || true
    ip netns delete "$NETNS"
  fi
}

# The images are tagged with a hash of what makes them: the functions above that build them, the
# pinned versions and image names, and the tools' cache folders (which name each tool's pins).
# `ensure` rebuilds what one of them changes, not for an edit elsewhere in this script.
case ${1:-} in
  image | node-image | ensure | up | down | clean | env) ;;
  *) sed -n 2,20p "$0"; exit 2 ;;
esac
key() { sha256sum | cut -c1-12; }
BASE_KEY=$( (declare -f build_base; sed -n '/^KIND_VERSION=/,/^HELPER_IMAGE=/p' "$0"
  for t in containerd runc cni-plugins; do tool_dir "$t"; done) | key)
NODE_KEY=$( (echo "$BASE_KEY"; declare -f build_tools static_image iptables_image build_tarball node_image
  for t in kubernetes etcd coredns local-path-provisioner; do tool_dir "$t"; done) | key)
BASE_IMAGE=localhost/kindest-base:llmtrain-$BASE_KEY
NODE_IMAGE=localhost/kindest-node:llmtrain-$NODE_KEY

case ${1:-} in
  image) setup; build_tools; build_base; build_tarball; node_image ;;
  ensure)
    setup
    if ! podman image exists "$NODE_IMAGE"; then
      build_tools
      podman image exists "$BASE_IMAGE" || build_base
      build_tarball
      node_image
    fi ;;
  env)
    printf 'export %q %q %q %q\n' "GOBIN=$GOBIN" "PATH=$PATH" "CONTAINERS_STORAGE_CONF=$CONTAINERS_STORAGE_CONF" \
      "CONTAINERS_CONF=$CONTAINERS_CONF"
    echo "export KIND_EXPERIMENTAL_PROVIDER=podman" ;;
  node-image) setup; node_image ;;
  up) setup; up ;;
  down) down ;;
  clean)
    down
    if grep -q " $W/" /proc/mounts; then echo "still mounted under $W" >&2; exit 1; fi
    rm -rf "$W" ;;
esac
