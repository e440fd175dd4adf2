#!/usr/bin/env bash
# The kvgate runtime image without pulling a base image: the release binary, exactly the
# shared libraries it links (and the dynamic loader) and a passwd entry for the non-root
# user, committed by `buildah from scratch`. The same runtime as the Dockerfile's, for
# machines that reach no container registry.
#
#   scripts/image.sh --build            release build (reused when fresh), then the image
#   scripts/image.sh --smoke            build the image in a throwaway store, unpack its root
#                                       filesystem and run kvgate from that tree alone under
#                                       chroot against simulated engines; what CI runs (root)
#   scripts/image.sh --run [ARGS...]    build, then run it with podman or docker; ARGS go to
#                                       kvgate (--control-plane-api-keys KEY --worker-urls URL)
#   scripts/image.sh --glibc-floor      print the binary's glibc floor; fail above the stated one
#
# Needs buildah (Debian: apt-get install buildah), curl and root for --smoke, and cargo
# unless IMAGE_BIN names a kvgate binary already built. Settings: IMAGE_NAME
# (localhost/kvgate:dev), IMAGE_UID (65532, distroless's nonroot), IMAGE_SIM_BIN (the
# kvgate-sim binary for --smoke; default beside IMAGE_BIN).
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
image="${IMAGE_NAME:-localhost/kvgate:dev}"
uid="${IMAGE_UID:-65532}"
target="${CARGO_TARGET_DIR:-$repo/target}"
data_dir=/var/lib/kvgate
gateway_port=30000
metrics_port=29000
# The newest glibc symbol version the binary may need, as docs/operations.md states it
# (a build on Debian 12 needs 2.34). A newer one fails --smoke rather than ship unnoticed.
glibc_floor=2.34

say() { printf '== %s\n' "$*" >&2; }
die() { printf 'image.sh: %s\n' "$*" >&2; exit 1; }

# Global buildah options: empty (the user's store) except for --smoke's throwaway store.
store=()
bah() { timeout 300 buildah "${store[@]}" "$@"; }

# One scratch directory for everything this run makes, removed on any exit with the
# processes and the working container it started.
work="$(mktemp -d "${TMPDIR:-/tmp}/kvgate-image.XXXXXX")"
pids=()
ctr=""
cleanup() {
  local p
  for p in "${pids[@]}"; do
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  [ -z "$ctr" ] || bah rm "$ctr" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

release_build() {
  if [ -n "${IMAGE_BIN:-}" ]; then
    bin="$IMAGE_BIN"
    sim="${IMAGE_SIM_BIN:-$(dirname "$bin")/kvgate-sim}"
  else
    command -v cargo >/dev/null || die "cargo not found (or set IMAGE_BIN)"
    say "release build (cargo reuses $target/release when it is fresh)"
    (cd "$repo" && cargo build --release --locked -p kvgate -p kvgate-engine-sim)
    bin="$target/release/kvgate"
    sim="$target/release/kvgate-sim"
  fi
  [ -x "$bin" ] || die "no kvgate binary at $bin"
  # A private copy: a shared target directory may be rebuilt under us.
  cp "$bin" "$work/kvgate"
  bin="$work/kvgate"
}

# The newest GLIBC_ symbol version $1 references.
glibc_needed() {
  objdump -T "$1" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1
}

check_glibc_floor() {
  local needed
  needed="$(glibc_needed "$1")"
  [ "$(printf '%s\n%s\n' "$needed" "$glibc_floor" | sort -V | tail -n 1)" = "$glibc_floor" ] \
    || die "$1 needs glibc $needed, above the stated floor $glibc_floor (docs/operations.md)"
  say "glibc floor: $needed (stated: $glibc_floor)"
}

# The image's tree: the binary, the libraries `ldd` lists and the loader, at the paths the
# binary asks for; files owned by root, only the data directory by the user.
assemble_rootfs() {
  local root="$1" lib
  install -d -m 0755 "$root/usr/local/bin" "$root/etc" "$root/var/lib"
  # Debug line tables are not needed at run time; symbols stay for backtraces.
  objcopy --strip-debug "$bin" "$root/usr/local/bin/kvgate"
  chmod 0755 "$root/usr/local/bin/kvgate"
  # `ldd` prints "name => /path (addr)" and "/lib64/ld-linux-x86-64.so.2 (addr)";
  # linux-vdso has no path. Each is copied (not its symlink) to the path named.
  for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
    install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
  done
  # No shell: the login shell field only has to name something.
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%s:%s:nonroot:/home/nonroot:/sbin/nologin\n' \
    "$uid" "$uid" >"$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:%s:\n' "$uid" >"$root/etc/group"
  # Engine host names (Service DNS names) resolve through glibc's built-in files and dns.
  printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
  # The CA bundle distroless ships too: https:// engines without --worker-ca-cert are
  # checked against it.
  [ -r /etc/ssl/certs/ca-certificates.crt ] \
    || die "no /etc/ssl/certs/ca-certificates.crt to copy (Debian: apt-get install ca-certificates)"
  install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  install -d -m 0700 -o "$uid" -g "$uid" "$root$data_dir"
}

build_image() {
  command -v buildah >/dev/null || die "buildah not found (Debian: apt-get install buildah)"
  release_build
  assemble_rootfs "$work/rootfs"
  say "assembling $image from scratch"
  bah rmi -f "$image" >/dev/null 2>&1 || true
  ctr="$(bah from scratch)"
  # As one tar, which `buildah add` unpacks with its owners and modes (`copy` would chown
  # everything to root, the data directory too).
  tar --numeric-owner -C "$work/rootfs" -cf "$work/rootfs.tar" .
  bah add --quiet "$ctr" "$work/rootfs.tar" / >/dev/null
  # The Dockerfile's runtime settings, one for one.
  bah config \
    --user "$uid:$uid" \
    --entrypoint '["/usr/local/bin/kvgate"]' \
    --env KVGATE_HOST=0.0.0.0 --env "KVGATE_DATA_DIR=$data_dir" \
    --port "$gateway_port" --port "$metrics_port" \
    --volume "$data_dir" \
    --workingdir / \
    --stop-signal SIGTERM \
    --label org.opencontainers.image.title=kvgate \
    "$ctr"
  bah commit --quiet --rm "$ctr" "$image" >/dev/null
  ctr=""
  say "built $image ($(du -sh "$work/rootfs" | cut -f1) uncompressed)"
  rm -rf "$work/rootfs" "$work/rootfs.tar"
}

# The committed image's root filesystem, unpacked from its layers into $1.
extract_rootfs() {
  local root="$1" layers="$work/layers" id
  # Uncompressed, each layer's blob is named by its diff ID.
  bah push --quiet --disable-compression "$image" "dir:$layers" >/dev/null
  mkdir -p "$root"
  for id in $(inspect '{{range .OCIv1.RootFS.DiffIDs}}{{.}} {{end}}'); do
    tar -xf "$layers/${id#sha256:}" -C "$root" --same-owner --numeric-owner
  done
  rm -rf "$layers"
}

inspect() { bah inspect --type image --format "$1" "$image"; }

# Running, not a zombie waiting to be reaped.
# The committed image's runtime settings against the Dockerfile's runtime stage, so the
# two ways to the image cannot drift apart unnoticed.
# shellcheck disable=SC2016 # $k and $v are Go template variables, for buildah
check_dockerfile_agrees() {
  local df="$repo/Dockerfile" want got
  [ -f "$df" ] || die "no Dockerfile at $df"
  want="user=$(awk '$1 == "USER" {print $2}' "$df")"
  want+=" entrypoint=$(sed -n 's/^ENTRYPOINT \["\([^"]*\)"\]$/\1/p' "$df")"
  want+=" volume=$(sed -n 's/^VOLUME \["\([^"]*\)"\]$/\1/p' "$df")"
  want+=" ports=$(awk '$1 == "EXPOSE" {$1 = ""; print}' "$df" | tr ' ' '\n' | grep . | sort | xargs)"
  want+=" env=$(grep -v '^ *#' "$df" | grep -o 'KVGATE_[A-Z_]*=[^ \\]*' | sort | xargs)"
  got="user=$(inspect '{{.OCIv1.Config.User}}')"
  got+=" entrypoint=$(inspect '{{range .OCIv1.Config.Entrypoint}}{{.}}{{end}}')"
  got+=" volume=$(inspect '{{range $k, $v := .OCIv1.Config.Volumes}}{{$k}}{{end}}')"
  got+=" ports=$(inspect '{{range $k, $v := .OCIv1.Config.ExposedPorts}}{{$k}} {{end}}' | tr ' ' '\n' | sed 's|/tcp$||' | grep . | sort | xargs)"
  got+=" env=$(inspect '{{range .OCIv1.Config.Env}}{{.}} {{end}}' | tr ' ' '\n' | grep . | sort | xargs)"
  [ "$want" = "$got" ] || die "the image and the Dockerfile disagree:
  Dockerfile: $want
  image:      $got"
  say "runtime settings as the Dockerfile's: $got"
}

alive() { [ -e "/proc/$1" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }

# Waits up to $2 seconds for `curl` to answer $1 with 200.
wait_200() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$1")" = 200 ] && return 0
    sleep 0.1
  done
  return 1
}

fail_with_log() { cat "$@" >&2 || true; }

smoke() {
  [ "$(id -u)" -eq 0 ] || die "--smoke needs root (chroot)"
  command -v curl >/dev/null || die "curl not found"
  # A store of its own: nothing left behind, nothing shared with a concurrent run, and vfs
  # works where overlay mounts are not allowed.
  store=(--root "$work/storage" --runroot "$work/run" --storage-driver vfs)
  build_image
  [ -x "$sim" ] || die "no kvgate-sim binary at $sim (set IMAGE_SIM_BIN)"
  local root="$work/rootfs"
  extract_rootfs "$root"
  say "the image's files:"
  (cd "$root" && find . -mindepth 1 -not -type d | sort) >&2

  # The image's own settings, applied as a container runtime would.
  local user entrypoint env_lines
  user="$(inspect '{{.OCIv1.Config.User}}')"
  entrypoint="$(inspect '{{range .OCIv1.Config.Entrypoint}}{{.}}{{end}}')"
  env_lines="$(inspect '{{range .OCIv1.Config.Env}}{{.}}{{"\n"}}{{end}}')"
  [ "$user" = "$uid:$uid" ] || die "image user is '$user', not $uid:$uid"
  [ -x "$root$entrypoint" ] || die "entrypoint $entrypoint is not in the image"
  if [ -e "$root/bin/sh" ] || [ -e "$root/usr/bin/sh" ]; then die "the image has a shell"; fi
  [ "$(stat -c %u:%g "$root$data_dir")" = "$uid:$uid" ] || die "$data_dir is not owned by $uid"
  [ "$(inspect '{{index .OCIv1.Config.Volumes "'"$data_dir"'"}}')" = "{}" ] \
    || die "$data_dir is not a volume"
  check_dockerfile_agrees
  check_glibc_floor "$root$entrypoint"

  say "simulated engines on loopback (outside the chroot)"
  "$sim" --engines 2 --base-port 0 --decode-step-base 1ms >"$work/sim.out" 2>"$work/sim.err" &
  pids+=($!)
  local urls=() i
  for ((i = 0; i < 100 && ${#urls[@]} < 2; i++)); do
    mapfile -t urls < <(grep '^http://' "$work/sim.out" || true)
    sleep 0.1
  done
  [ "${#urls[@]}" -eq 2 ] || { fail_with_log "$work/sim.err"; die "kvgate-sim did not start"; }

  say "kvgate from the image's tree alone: chroot as $user, only the image's environment"
  local key pid addr="" port
  key="smoke-$RANDOM$RANDOM"
  local env_args=()
  mapfile -t env_args < <(printf '%s' "$env_lines" | grep .)
  # The image's KVGATE_HOST=0.0.0.0 stands (so the admin key is required, as in a pod);
  # port 0 as the host's network is shared. env -i leaves no PATH to find chroot by.
  env -i "${env_args[@]}" \
    "$(command -v chroot)" --userspec="$user" "$root" "$entrypoint" \
    --port 0 \
    --worker-urls "${urls[@]}" \
    --control-plane-api-keys "$key" \
    --shutdown-delay-secs 1 --shutdown-grace-period-secs 10 \
    >"$work/kvgate.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  for ((i = 0; i < 300; i++)); do
    addr="$(grep -o 'kvgate listening addr=[0-9.]*:[0-9]*' "$work/kvgate.log" 2>/dev/null | head -n1 | cut -d= -f2 || true)"
    [ -n "$addr" ] && break
    alive "$pid" || break
    sleep 0.1
  done
  [ -n "$addr" ] || { fail_with_log "$work/kvgate.log"; die "kvgate did not start in the chroot"; }
  port="${addr##*:}"
  local base="http://127.0.0.1:$port" running_uid
  running_uid="$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")"
  [ "$running_uid" = "$uid" ] || die "kvgate runs as uid $running_uid, not $uid"
  say "listening on $addr as uid $running_uid"

  wait_200 "$base/health" 10 || { fail_with_log "$work/kvgate.log"; die "/health did not answer 200"; }
  say "/health: 200"
  wait_200 "$base/readiness" 20 || { fail_with_log "$work/kvgate.log"; die "/readiness did not reach 200"; }
  say "/readiness: 200 (engines ready)"

  local code
  code="$(curl -s -o "$work/chat.json" -w '%{http_code}' --max-time 30 \
    "$base/v1/chat/completions" -H 'content-type: application/json' \
    -d '{"model":"kvgate-sim-model","messages":[{"role":"user","content":"Hello from the image"}],"max_tokens":8}')"
  if [ "$code" != 200 ] || ! grep -q '"choices"' "$work/chat.json"; then
    fail_with_log "$work/chat.json" "$work/kvgate.log"
    die "chat answered $code"
  fi
  say "chat completion through the chrooted kvgate: 200"
  if grep -q 'no system root certificates' "$work/kvgate.log"; then
    fail_with_log "$work/kvgate.log"
    die "kvgate found no CA certificates in the image"
  fi
  say "CA certificates found"
  code="$(curl -s -o "$work/metrics.txt" -w '%{http_code}' --max-time 5 \
    -H "Authorization: Bearer $key" "$base/metrics")"
  if [ "$code" != 200 ] || ! grep -q '^kvgate_' "$work/metrics.txt"; then
    fail_with_log "$work/kvgate.log"
    die "/metrics with the admin key answered $code"
  fi
  say "/metrics with the admin key: 200"

  say "SIGTERM"
  kill -TERM "$pid"
  local status=""
  for ((i = 0; i < 300; i++)); do
    if ! alive "$pid"; then
      wait "$pid" && status=0 || status=$?
      break
    fi
    sleep 0.1
  done
  [ -n "$status" ] || { fail_with_log "$work/kvgate.log"; die "kvgate still running 30 s after SIGTERM"; }
  [ "$status" -eq 0 ] || { fail_with_log "$work/kvgate.log"; die "kvgate exited $status after SIGTERM"; }
  # The final snapshot went to the data directory, the one place the user may write.
  [ -n "$(ls -A "$root$data_dir")" ] || die "nothing written under $data_dir"
  say "stopped on SIGTERM: exit 0, data directory written"
  say "image smoke passed"
}

run() {
  build_image
  # As the Deployment runs it: read-only root, the data directory on a volume.
  local args=(--rm --read-only -p "$gateway_port:$gateway_port" -v kvgate-data:"$data_dir")
  if command -v podman >/dev/null; then
    # podman reads the same local storage buildah wrote.
    podman run "${args[@]}" "$image" "$@"
  elif command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    bah push --quiet "$image" "docker-daemon:$image" >/dev/null
    docker run "${args[@]}" "$image" "$@"
  else
    die "neither podman nor a running docker daemon: try --smoke"
  fi
}

case "${1:-}" in
  --build) build_image ;;
  --smoke) smoke ;;
  --run) shift; run "$@" ;;
  --glibc-floor) release_build; check_glibc_floor "$bin"; glibc_needed "$bin" ;;
  # The header comment is the usage.
  *) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0" >&2; exit 2 ;;
esac
