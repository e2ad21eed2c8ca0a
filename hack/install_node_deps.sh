#!/usr/bin/env bash
# Debian packages the real node of the cluster tier and the kind run need (`make tools` runs this; CI starts bare):
#   libseccomp-dev  runc is built with cgo and the seccomp tag (RuntimeDefault profiles)
#   iptables        the CNI bridge plugin's masquerade rules and kube-proxy's Service rules
#   busybox-static  the static binary in the smoke test's image (tests/pods)
#   iproute2        `ip netns` and the veth pair the node's network namespace hangs on
#   podman          kind's provider in the kind end-to-end run's local mode (tests/e2e/run.sh)
# Installs only what is missing, so a warm machine never touches apt.
set -euo pipefail
packages=(libseccomp-dev iptables busybox-static iproute2 gcc libc6-dev podman)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
echo "installing Debian packages: ${missing[*]}"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
