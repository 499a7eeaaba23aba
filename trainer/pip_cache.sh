# shellcheck shell=bash
# trainstack package cache: the trainer's packages (~3 GB of NVIDIA wheels) archived in the
# stack's own bucket by the first machine that installs them from the package index, and
# unpacked by every later machine (docs/boot.md). It travels in the trainer's code archive
# beside the requirement files it caches (the machine's user data has a 16 KiB limit), and is
# sourced by userdata/bootstrap.sh after userdata/lib.sh, whose store calls and names it uses:
# cache/pip/<key>/<sha256>.tar.gz, then cache/pip/<key>/COMMITTED (that sha256), written last.
# The variables below come from lib.sh.
# shellcheck disable=SC2154

# pip_cache_uri KEY: cache/pip/<key> in the run's bucket (the run is <bucket>/runs/<id>): the
# packages installed for one (requirements, image) key.
pip_cache_uri() {
  local b="${RUN_URI#*://}"
  printf '%s://%s/%s%s/%s\n' "${RUN_URI%%://*}" "${b%%/*}" "$CACHE_PREFIX" "$PIP_CACHE_DIR" "$1"
}

# pip_cache_digest URI: the sha256 the key's COMMITTED names; fails when it has none (nothing
# cached yet, or only an archive whose upload never committed) or the store does not answer.
pip_cache_digest() {
  local d
  # grep reads it all (no -q): under pipefail an early exit could fail the listing with SIGPIPE.
  retry 3 store_ls "$1/" | grep -xF "$COMMITTED" >/dev/null || return 1
  d="$(retry 3 store_cat "$1/$COMMITTED" | head -n 1)"
  [[ "$d" =~ ^[0-9a-f]{64}$ ]] && printf '%s\n' "$d"
}

# pip_cache_unpack URI DIGEST DIR: the archive, unpacked into DIR as it downloads, its bytes
# hashed on the way (tee -p: a tar that gives up early does not cut the download short).
# 0: whole, and its sha256 is DIGEST; 1: the copy failed (a store blip: worth another try);
# 2: whole but another sha256, or it does not unpack (no use fetching it again).
pip_cache_unpack() {
  local st sum
  rm -rf "$3" "$3.p"
  mkdir -p "$3"
  mkfifo "$3.p"
  sha256sum <"$3.p" >"$3.s" &
  store_cp "$1/$2.tar.gz" - | tee -p "$3.p" | tar -xzf - -C "$3"
  st=("${PIPESTATUS[@]}")
  wait $! || true
  sum="$(cut -c1-64 "$3.s")"
  rm -f "$3.p" "$3.s"
  ((st[0] == 0)) || return 1
  [[ "$sum" != "$2" ]] || ((st[2] != 0)) || return 0
  log "the cached packages $1/$2.tar.gz have sha256 $sum (tar: ${st[2]}): not used"
  return 2
}

# pip_cache_get KEY DIR: the packages cached for KEY unpacked into DIR (new). Fails when nothing
# is cached, the store does not answer within 3 tries of TRAINSTACK_PIP_CACHE_WAIT_S (900 s)
# each, or the archive is damaged: the caller installs from the package index instead.
pip_cache_get() {
  local uri d i rc=1
  uri="$(pip_cache_uri "$1")"
  d="$(pip_cache_digest "$uri")" || return 1
  for i in 1 2 3; do
    rc=0
    STORE_TIMEOUT="${TRAINSTACK_PIP_CACHE_WAIT_S:-900}" pip_cache_unpack "$uri" "$d" "$2" || rc=$?
    ((rc == 1 && i < 3)) || break
    log "fetching the cached packages $1: try $i failed"
    sleep "$((${TRAINSTACK_RETRY_BASE_S:-2} * i))"
  done
  ((rc == 0)) && log "packages $1 from the bucket's cache ($d)" && return 0
  rm -rf "$2"
  return 1
}

# pip_cache_put KEY DIR: DIR archived as the packages for KEY, unless a commit is there already.
# The archive goes up under its own sha256 (gzip level 1: a higher one costs the CPU minutes),
# then COMMITTED is created naming it: a partial upload is never committed, and of several
# machines caching one key at once one commit wins (a losing machine's archive stays unnamed).
# gcloud would split a file over 150 MiB into parts elsewhere and delete them (parallel
# composite uploads), which the machine may not. Never fails the boot: logs and returns.
pip_cache_put() {
  local uri tmp d rc=2 i
  uri="$(pip_cache_uri "$1")"
  pip_cache_digest "$uri" >/dev/null && log "packages $1 cached already" && return 0
  tmp="$(mktemp "$2.XXXXXX")"
  if ! { tar -cf - -C "$2" . | gzip -1 -n >"$tmp" && d="$(sha256sum "$tmp" | cut -c1-64)" &&
    CLOUDSDK_STORAGE_PARALLEL_COMPOSITE_UPLOAD_ENABLED=False STORE_TIMEOUT="${TRAINSTACK_PIP_CACHE_WAIT_S:-900}" \
      retry 3 store_cp "$tmp" "$uri/$d.tar.gz"; }; then
    rm -f "$tmp"
    log "could not upload the packages $1 to the bucket's cache"
    return 1
  fi
  rm -f "$tmp"
  for i in 1 2 3; do
    rc=0
    printf '%s\n' "$d" | store_create "$uri/$COMMITTED" || rc=$?
    ((rc == 2)) || break
    sleep "${TRAINSTACK_RETRY_BASE_S:-2}"
  done
  case "$rc" in
    0) log "packages $1 cached in the bucket ($d)" ;;
    1) log "packages $1: another machine cached them first" ;;
    *) return 1 ;;
  esac
}
