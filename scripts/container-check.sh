#!/usr/bin/env bash
# Build the zbak image from docker/Dockerfile and run `zbak --version` and
# `zbak config check` (docker/zbak.toml) in it, with the first container builder that works
# on this machine: podman, docker with a running engine, or buildah (docs/install.md#docker).
#
#   ./scripts/container-check.sh        (as root; rootful podman is what it was tested with)
#
# Environment:
#   ZBAK_IMAGE        the image to build and keep (default zbak:local)
#   ZBAK_BUILDER      podman, docker or buildah (default: the first of these that works)
#   ZBAK_BASE_IMAGE   the Dockerfile's DEBIAN base (default debian:bookworm-slim). When it
#                     cannot be pulled (no registry reachable) and debootstrap is installed,
#                     a minimal bookworm is bootstrapped from the Debian archive
#                     (ZBAK_DEBIAN_MIRROR, default http://deb.debian.org/debian) and imported
#                     as localhost/zbak-base:bookworm, which later runs reuse.
#   PIP_CERT          a CA bundle for pip behind a TLS-intercepting proxy; passed to the
#                     build as the pip_cert secret (never stored in the image). Default: the
#                     bundle this host's pip is configured with, if any.
set -euo pipefail
cd "$(dirname "$0")/.."

image=${ZBAK_IMAGE:-zbak:local}
base=${ZBAK_BASE_IMAGE:-debian:bookworm-slim}
bootstrapped=localhost/zbak-base:bookworm
mirror=${ZBAK_DEBIAN_MIRROR:-http://deb.debian.org/debian}
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' zrepl_py/__init__.py)
say() { echo "container-check: $*"; }
die() { echo "container-check: $*" >&2; exit 1; }

# podman's default ulimits (nofile 1048576) exceed what a builder without CAP_SYS_RESOURCE
# may set, so the containers of this check get modest ones.
ulimits=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
podman_runtime=()

works() { "$@" >/dev/null 2>&1; }

pick_builder() {
  local wanted=${ZBAK_BUILDER:-}
  if [[ -z $wanted || $wanted == podman ]] && command -v podman >/dev/null; then
    echo podman; return
  fi
  if [[ -z $wanted || $wanted == docker ]] && command -v docker >/dev/null \
      && works docker info; then
    echo docker; return
  fi
  if [[ -z $wanted || $wanted == buildah ]] && command -v buildah >/dev/null; then
    echo buildah; return
  fi
  die "no container builder works here${wanted:+ (asked for $wanted)}: install podman" \
      "(apt-get install podman runc) or start a docker engine"
}

has_image() {
  case $builder in
    podman) works podman image exists "$1" ;;
    docker) works docker image inspect "$1" ;;
    buildah) works buildah inspect --type image "$1" ;;
  esac
}

pull() {
  case $builder in
    podman) works podman pull "$1" ;;
    docker) works docker pull "$1" ;;
    buildah) works buildah pull "$1" ;;
  esac
}

bootstrap_base() {
  command -v debootstrap >/dev/null \
    || die "cannot pull $base and debootstrap is not installed to make a base:" \
           "apt-get install debootstrap, or set ZBAK_BASE_IMAGE to an image you have"
  local tmp
  tmp=$(mktemp -d /var/tmp/zbak-base.XXXXXX)
  trap 'rm -rf "$tmp"' EXIT
  say "bootstrapping bookworm (minbase) from $mirror as $bootstrapped"
  debootstrap --variant=minbase bookworm "$tmp/root" "$mirror" >"$tmp/log" 2>&1 \
    || { tail -20 "$tmp/log" >&2; die "debootstrap failed"; }
  rm -rf "$tmp/root/var/lib/apt/lists/"* "$tmp/root/var/cache/apt/"*.bin
  tar -C "$tmp/root" -cf "$tmp/root.tar" .
  case $builder in
    podman) podman import "$tmp/root.tar" "$bootstrapped" >/dev/null ;;
    docker) docker import "$tmp/root.tar" "$bootstrapped" >/dev/null ;;
    buildah)
      local ctr
      ctr=$(buildah from scratch)
      buildah add "$ctr" "$tmp/root.tar" / >/dev/null
      buildah commit --rm "$ctr" "$bootstrapped" >/dev/null ;;
  esac
  rm -rf "$tmp"
  trap - EXIT
}

# The OCI runtime podman can start a container with: crun refuses a host with hybrid
# cgroups (v1 controllers plus a v2 mount), where runc works.
pick_podman_runtime() {
  local runtime
  for runtime in "" runc crun; do
    if [[ -n $runtime ]] && ! command -v "$runtime" >/dev/null; then continue; fi
    podman_runtime=(${runtime:+--runtime "$runtime"})
    if works podman "${podman_runtime[@]}" run --rm "${ulimits[@]}" "$base" true; then
      say "podman runs containers${runtime:+ with --runtime $runtime}"
      return
    fi
  done
  die "podman cannot start a container from $base here (tried its default runtime, runc" \
      "and crun): see 'podman run --rm $base true'"
}

pip_cert() {
  local cert=${PIP_CERT:-}
  if [[ -z $cert ]] && command -v python3 >/dev/null; then
    cert=$(python3 -m pip config get global.cert 2>/dev/null || true)
  fi
  [[ -n $cert && -s $cert ]] && echo "$cert" || true
}

build_args() {
  local cert
  args=(--build-arg "DEBIAN=$base" -f docker/Dockerfile -t "$image")
  cert=$(pip_cert)
  if [[ -n $cert ]]; then
    say "pip in the build trusts $cert (build secret pip_cert)"
    args+=(--secret "id=pip_cert,src=$cert")
  fi
}

run_in_image() {  # run_in_image [-v HOST:CONTAINER:ro] ZBAK-ARGS...
  local volume=()
  if [[ $1 == -v ]]; then volume=(-v "$2"); shift 2; fi
  case $builder in
    podman) podman "${podman_runtime[@]}" run --rm "${ulimits[@]}" "${volume[@]}" "$image" "$@" ;;
    docker) docker run --rm "${volume[@]}" "$image" "$@" ;;
    buildah)
      local ctr status=0
      ctr=$(buildah from "$image")
      buildah run --isolation chroot "${volume[@]}" "$ctr" -- zbak "$@" || status=$?
      buildah rm "$ctr" >/dev/null
      return $status ;;
  esac
}

builder=$(pick_builder)
say "builder: $builder ($("$builder" --version | head -1))"
if ! has_image "$base" && ! pull "$base"; then
  if [[ -n ${ZBAK_BASE_IMAGE:-} ]]; then die "cannot pull $base"; fi
  say "cannot pull $base: using $bootstrapped"
  base=$bootstrapped
  has_image "$base" || bootstrap_base
fi
say "base image: $base"
[[ $builder == podman ]] && pick_podman_runtime

build_args
case $builder in
  # --layers=false: no cached stage images left behind; the ignore file keeps .venv out.
  podman) podman "${podman_runtime[@]}" build --layers=false "${ulimits[@]}" \
            --ignorefile docker/Dockerfile.dockerignore "${args[@]}" . ;;
  docker) DOCKER_BUILDKIT=1 docker build "${args[@]}" . ;;
  buildah) buildah bud --layers=false --isolation chroot \
             --ignorefile docker/Dockerfile.dockerignore "${args[@]}" . ;;
esac

say "zbak --version in $image"
got=$(run_in_image --version)
echo "$got"
[[ $got == "zbak, version $version" ]] || die "expected 'zbak, version $version'"
say "zbak config check in $image (docker/zbak.toml)"
run_in_image -v "$PWD/docker/zbak.toml:/etc/zbak/zbak.toml:ro" config check \
  || die "zbak config check failed in $image"
say "ok: $image builds, and zbak --version and config check run in it"
