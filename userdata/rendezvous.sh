# shellcheck shell=bash
# trainstack rendezvous, sourced by supervise.sh: which machines train together, in which
# order, when the run has several (TRAINSTACK_NODES > 1). docs/multinode.md explains it.
#
# Membership is decided in the run folder, not from each machine's own view of its group
# (on AWS a machine under a spot notice still reads as running for two minutes; a
# replacement's address can sort anywhere), so two machines can never start with
# different worker lists:
#   rendezvous/gen-<G>/members/<member>  one per machine that joined generation G
#                                        ({"member", "machine", "endpoint", "time"}),
#                                        rewritten every poll as its heartbeat;
#   rendezvous/gen-<G>/sealed            the generation's worker list ({"generation",
#                                        "workers": [{"member", "machine", "endpoint"}]}),
#                                        created once by whichever machine first sees
#                                        `nodes` live members: a conditional create (S3
#                                        If-None-Match: *, GCS if-generation-match=0)
#                                        that fails for everyone after the first.
# Every machine reads the sealed record and takes its worker order (and so the chief,
# worker 0) from it. A member is one boot of one machine (instance id + a token made at
# boot): GCE recreates a preempted machine under the same name. A machine runs each
# generation at most once: whatever ended its trainer (its own notice, a peer's notice,
# a lost peer, a cluster that did not form, a crash), it joins the next generation, and
# so do the others when theirs ends. A machine with a pending spot notice never joins.
# The variables below are used by supervise.sh.
# shellcheck disable=SC2034

GEN_DIR="gen-"
MEMBERS_DIR="members"
SEALED="sealed"
# Where this boot keeps the generation it last ran (in /run: a new boot is a new member).
LAST_GENERATION_FILE="$RUNTIME_DIR/generation"

# The outcomes of join_generation other than 0 (joined).
JOIN_NOTICE=1
JOIN_ENDED=2
JOIN_DEADLINE=3
JOIN_NO_ADDRESS=4
JOIN_FAILED=5 # the run cannot go on: JOIN_REASON says why

# This boot's member name: the machine's id and a token made once per boot (/run is lost
# at power-off).
member_id() {
  local file="$RUNTIME_DIR/boot-token"
  if [[ ! -s "$file" ]]; then
    tr -dc 'a-z0-9' </proc/sys/kernel/random/uuid | head -c 8 >"$file.$$"
    mv "$file.$$" "$file"
  fi
  printf '%s-%s\n' "$(instance_id)" "$(cat "$file")"
}

# The generations the run has had, one number a line, ascending.
generations() {
  store_ls "$RUN_URI/$RENDEZVOUS_PREFIX" | sed -nE "s#^${GEN_DIR}([0-9]+)/?\$#\\1#p" | sort -n
}

# generation_objects GEN: every object of generation GEN (its sealed record, when there is
# one, and its members), one JSON object a line: one call per poll, whatever the group's size.
generation_objects() {
  store_cat_all "$RUN_URI/$RENDEZVOUS_PREFIX$GEN_DIR$1"
}

# heartbeat GEN MEMBER ENDPOINT [left]: (re)writes this machine's member object in GEN and
# prints it. `left` marks it gone at once (a notice came while it waited), instead of
# after the TTL.
heartbeat() {
  local body
  body="$(json member="$2" machine="$(instance_id)" endpoint="$3" "time:=$EPOCHSECONDS" "left:=${4:-false}")"
  store_put "$RUN_URI/$RENDEZVOUS_PREFIX$GEN_DIR$1/$MEMBERS_DIR/$2" <<<"$body" && printf '%s\n' "$body"
}

# live_members [ME] < OBJECTS: "endpoint member machine" of each member among a generation's
# objects whose heartbeat is younger than RENDEZVOUS_TTL_S, sorted by address (the
# proposed worker order). ME, this machine's member, is live unless it left, however old
# its heartbeat reads: it was just written, and a slow store call must not age it out.
live_members() {
  python3 -c '
import json, re, sys, time
ttl, me, now, seen = float(sys.argv[1]), sys.argv[2], time.time(), {}
for line in sys.stdin:
    try:
        m = json.loads(line)
        if m.get("left") or (m["member"] != me and now - float(m["time"]) > ttl):
            continue
        seen[m["member"]] = (str(m["endpoint"]), str(m["machine"]))
    except (ValueError, KeyError, TypeError):
        continue  # a member object being rewritten, or not ours: ignored this poll
def order(item):  # by address, numerically: 10.0.0.9 before 10.0.0.10
    return [int(p) if p.isdigit() else p for p in re.split(r"[.:]", item[1][0])]
for member, (endpoint, machine) in sorted(seen.items(), key=order):
    print(endpoint, member, machine)
' "$RENDEZVOUS_TTL_S" "${1:-}"
}

# seal GEN NODES LIVE: proposes the first NODES live members as GEN's workers. Only the
# first proposal is stored (a conditional create); every machine then reads that one.
# Returns store_create's answer (1: another machine sealed first; 2: the write failed).
seal() {
  local record
  record="$(python3 -c '
import json, sys
gen, nodes = int(sys.argv[1]), int(sys.argv[2])
workers = [dict(zip(("endpoint", "member", "machine"), line.split())) for line in sys.stdin.read().splitlines()[:nodes]]
print(json.dumps({"generation": gen, "workers": workers}, separators=(",", ":")))
' "$1" "$2" <<<"$3")"
  store_create "$RUN_URI/$RENDEZVOUS_PREFIX$GEN_DIR$1/$SEALED" <<<"$record" || return
  log "sealed generation $1: $(cut -d' ' -f1 <<<"$3" | head -n "$2" | tr '\n' ' ')"
}

# tf_config_from SEALED MEMBER: the TF_CONFIG line for MEMBER in the sealed record; fails
# when the record does not name it.
tf_config_from() {
  python3 -c '
import json, sys
record, me = json.loads(sys.argv[1]), sys.argv[2]
members = [w["member"] for w in record["workers"]]
if me not in members:
    sys.exit(1)
workers = [w["endpoint"] for w in record["workers"]]
conf = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": members.index(me)}}
print("TF_CONFIG=" + json.dumps(conf, separators=(",", ":")))
' "$1" "$2"
}

# join_generation: waits until a sealed generation names this machine, then appends its
# TF_CONFIG to CONTAINER_ENV and records the generation as run. Returns 0 then, or
# JOIN_NOTICE (a spot notice is pending: this machine does not join), JOIN_ENDED (the
# run has an end marker, in END_MARKER), JOIN_DEADLINE, JOIN_NO_ADDRESS (the metadata
# service does not say this machine's address) or JOIN_FAILED (JOIN_REASON says why).
# Machines wait, paid and idle, for the others at most TRAINSTACK_PEER_WAIT_S (a zone
# without spot capacity may bring no replacement for hours); a failing seal is tried each
# poll, at most TRAINSTACK_SEAL_TRIES times in a row.
join_generation() {
  local nodes="$TRAINSTACK_NODES" me endpoint last gen high objects record mine live polls=0 line
  local peer_wait_s="${TRAINSTACK_PEER_WAIT_S:-1800}" seal_tries="${TRAINSTACK_SEAL_TRIES:-30}"
  local started waited came=1 told=0 failed_seals=0 rc quick=0 step
  started=$EPOCHSECONDS
  me="$(member_id)"
  endpoint="$(retry 5 private_ip)" || { log "cannot read this machine's private address"; return "$JOIN_NO_ADDRESS"; }
  endpoint="$endpoint:$WORKER_PORT"
  last="$(cat "$LAST_GENERATION_FILE" 2>/dev/null || echo -1)"
  gen=$((last + 1))
  log "joining the next generation after $last as $me ($endpoint); $nodes machines train together"
  while true; do
    if [[ -e "$NOTICE_FILE" ]]; then
      heartbeat "$gen" "$me" "$endpoint" true >/dev/null || true
      log "a spot notice is pending: not joining generation $gen"
      return "$JOIN_NOTICE"
    fi
    ((EPOCHSECONDS < DEADLINE)) || return "$JOIN_DEADLINE"
    waited=$((EPOCHSECONDS - started))
    if ((waited >= peer_wait_s)); then
      step="$(newest_committed)"
      JOIN_REASON="the cluster did not form: $came of $nodes machines came to generation $gen in ${waited}s (spot capacity?). Checkpoints kept (step $step); to go on once there is capacity, delete $FAILED and set the group back to $nodes machines"
      return "$JOIN_FAILED"
    fi
    if ((!told && waited >= RENDEZVOUS_TTL_S)); then
      # A lost member's heartbeat has expired by now: say so where `ops status` reads it.
      told=1
      event "$WAITING_FOR_MACHINES" "generation:=$gen" "came:=$came" "nodes:=$nodes" \
        "since=$(date -u -d "@$started" +%FT%TZ)" "until=$(date -u -d "@$((started + peer_wait_s))" +%FT%TZ)" || true
    fi
    if ((polls % 5 == 0)); then
      # Another machine may have ended the run (FAILED, TIMED_OUT, CANCELLED) meanwhile.
      END_MARKER="$(end_marker)" || END_MARKER=""
      [[ -z "$END_MARKER" ]] || return "$JOIN_ENDED"
      # A generation newer than this one exists (this machine is a replacement, or was
      # slow): join the newest instead.
      high="$(generations | tail -n 1)"
      ((${high:--1} <= gen)) || gen=$high
    fi
    polls=$((polls + 1))
    objects="$(generation_objects "$gen")" || objects=""
    record="$(grep -m 1 '"workers"' <<<"$objects")" || record=""
    if [[ -n "$record" ]]; then
      if line="$(tf_config_from "$record" "$me")"; then
        printf '%s\n' "$line" >>"$CONTAINER_ENV"
        echo "$gen" >"$LAST_GENERATION_FILE"
        log "generation $gen: $line"
        return 0
      fi
      # Sealed without this machine (it came late, or was not yet live): the next one.
      log "generation $gen was sealed without this machine: joining $((gen + 1))"
      gen=$((gen + 1))
      continue
    fi
    mine="$(heartbeat "$gen" "$me" "$endpoint")" || log "could not write this machine's heartbeat (retrying)"
    objects+=$'\n'"$mine"
    live="$(live_members "$me" <<<"$objects")" || live=""
    came="$(grep -c . <<<"$live")" || came=0
    if ((came >= nodes)) && grep -q " $me " <<<"$live"; then
      rc=0
      seal "$gen" "$nodes" "$live" || rc=$?
      if ((rc == 2)); then
        failed_seals=$((failed_seals + 1))
        if ((failed_seals >= seal_tries)); then
          JOIN_REASON="could not write generation $gen's worker list ($failed_seals tries): ${STORE_ERROR:-see logs}"
          return "$JOIN_FAILED"
        fi
      else
        failed_seals=0
        # Sealed (by anyone): read the list at once, once a poll (never a hot loop).
        if ((!quick)); then
          quick=1
          continue
        fi
      fi
    fi
    quick=0
    sleep "$CLUSTER_POLL_S"
  done
}

# This machine's private address, the one its peers reach (rendezvous.sh publishes it).
private_ip() {
  case "$TRAINSTACK_CLOUD" in
    aws) md_get local-ipv4 ;;
    gcp) md_get network-interfaces/0/ip ;;
  esac
}
