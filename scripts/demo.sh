#!/usr/bin/env bash
# The README's main job (docs/development.md#the-main-job-scriptsdemosh): a real zbak cycle on real pools and real data.
# Creates a source and a backup pool on sparse files, fills a dataset tree with a copy of
# /usr/share/doc, then runs every zbak command that exists, with changes between snapshots.
# Pools are destroyed at the end unless ZBAK_DEMO_KEEP=1.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
./scripts/setup-host.sh

work=${ZBAK_DEMO_DIR:-/var/tmp/zbak-demo}
src=zbakdemo_src
bak=zbakdemo_bak

daemon_pid=
churn_pid=
cleanup() {
  for pid in $churn_pid $daemon_pid; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; done
  [[ -f "$work/ssh/sshd.pid" ]] && kill "$(cat "$work/ssh/sshd.pid")" 2>/dev/null || true
  for pool in "$src" "$bak"; do
    if zpool list "$pool" >/dev/null 2>&1; then
      for _ in 1 2 3 4 5 6 7 8 9 10; do zpool destroy -f "$pool" 2>/dev/null && break; sleep 1; done
    fi
  done
}
cleanup
rm -rf "$work"
mkdir -p "$work"
[[ "${ZBAK_DEMO_KEEP:-0}" == 1 ]] || trap cleanup EXIT

# zfs-fuse answers "dataset is busy" for a moment after an unmount (docs/testbed.md#zfs-fuse).
retry() { for _ in 1 2 3 4 5 6 7 8 9 10; do "$@" 2>/dev/null && return 0; sleep 1; done; "$@"; }
fail() { printf 'demo: FAILED: %s\n' "$*" >&2; exit 1; }
step() { printf '\n\033[1m== %s\033[0m  (%d s)\n' "$*" "$SECONDS"; }
zbak() { printf '$ zbak %s\n' "$*"; "$root/.venv/bin/zbak" --config "$work/zbak.toml" "$@"; }

step "pools on sparse files"
truncate -s 3G "$work/src.img" "$work/bak.img"
zpool create -m "$work/mnt/$src" "$src" "$work/src.img"
zpool create -m "$work/mnt/$bak" "$bak" "$work/bak.img"
zfs create "$src/data"
zfs create "$src/data/docs"
zfs create "$src/data/scratch"
zfs create "$src/site"
zpool list "$src" "$bak"

step "real data: a copy of /usr/share/doc, and the licenses as a small web site"
cp -a /usr/share/doc/. "$work/mnt/$src/data/docs/"
cp -a /usr/share/common-licenses/. "$work/mnt/$src/site/"
echo "scratch space, excluded from the job" > "$work/mnt/$src/data/scratch/tmp.txt"
zfs list -r "$src"

step "an OpenSSH server on 127.0.0.1 plays the backup host (keys made for this run)"
mkdir -p "$work/ssh" /run/sshd
ssh-keygen -q -t ed25519 -N '' -f "$work/ssh/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$work/ssh/id_ed25519"
cp "$work/ssh/id_ed25519.pub" "$work/ssh/authorized_keys"
port=$("$root/.venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# SHLVL=1: bash takes each command's shell as nested and skips root's ~/.bashrc, whose
# set-up (pyenv, conda) would otherwise run before every remote command of the demo
cat > "$work/ssh/sshd_config" <<SSHD
Port $port
ListenAddress 127.0.0.1
HostKey $work/ssh/host_key
AuthorizedKeysFile $work/ssh/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
StrictModes no
PidFile $work/ssh/sshd.pid
SetEnv SHLVL=1
SSHD
/usr/sbin/sshd -f "$work/ssh/sshd_config"
echo "[127.0.0.1]:$port $(cut -d' ' -f1,2 "$work/ssh/host_key.pub")" > "$work/ssh/known_hosts"
echo "sshd listening on 127.0.0.1:$port"

cat > "$work/zbak.toml" <<TOML
state_dir = "$work/state"

[hosts.backup]
address = "127.0.0.1"
port = $port
user = "root"
identity_file = "$work/ssh/id_ed25519"
known_hosts = "$work/ssh/known_hosts"

# The whole tree (but scratch) to the backup pool, as ZFS streams over ssh.
[jobs.demo]
dataset = "$src/data"
recursive = true
exclude = ["scratch"]

[jobs.demo.snapshot]
prefix = "zbak"
schedule = "*/15 * * * *"
retention = { keep_last = 2, hourly = 0, daily = 0 }

[jobs.demo.replicate]
targets = ["backup:$bak/data"]
compression = "zstd"

# Cold copies: chains of zstd-compressed send streams in a directory store.
[stores.cold]
url = "file://$work/cold"
volume_size = "64MiB"

[jobs.demo.archive]
store = "cold"

# The site as plain files on a host without ZFS: the rsync fallback.
[jobs.mirror]
dataset = "$src/site"

[jobs.mirror.snapshot]
prefix = "mirror"
retention = { keep_last = 2, hourly = 0, daily = 0 }

[jobs.mirror.replicate]
targets = ["backup:$work/rsync-mirror"]
TOML
step "config ($work/zbak.toml)"
cat "$work/zbak.toml"
zbak config check

step "catalog and preflight"
zbak init

step "snapshots with changes between them"
zbak snapshot
for round in 1 2 3; do
  sleep 1.1   # names have one-second resolution
  cp -a /usr/share/common-licenses "$work/mnt/$src/data/docs/licenses-round-$round"
  rm -rf "$work/mnt/$src/data/docs/$(ls "$work/mnt/$src/data/docs" | head -1)"
  zbak snapshot
done
zfs snapshot "$src/data@before-upgrade"   # a user snapshot: zbak never prunes it
zbak list snapshots demo

step "replicate: plan, then the first run (full, then -I up to the newest)"
zbak replicate --dry-run
zbak replicate
zfs list -t snapshot -o name -r "$bak/data"
zfs list -t snapshot -o name,userrefs -r "$src/data"   # zbak holds the newest replicated base

step "change files, snapshot, replicate again: incremental"
cp -a /usr/share/common-licenses "$work/mnt/$src/data/docs/licenses-after-first-replication"
echo "edited after the first replication" >> "$work/mnt/$src/data/docs/$(ls "$work/mnt/$src/data/docs" | tail -1)/README.demo"
sleep 1.1
zbak snapshot demo
zbak replicate demo

step "the replica has the source's guids and files"
diff <(zfs list -H -t snapshot -o name -r "$src/data/docs" | sed 's/^[^@]*@//') \
     <(zfs list -H -t snapshot -o name -r "$bak/data/docs" | sed 's/^[^@]*@//') || fail "the replica's snapshots differ"
echo "same snapshots on both sides"
for snap in $(zfs list -H -t snapshot -o name -r "$src/data/docs" | sed 's/^[^@]*@//'); do
  a=$(zfs get -Hp -o value guid "$src/data/docs@$snap"); b=$(zfs get -Hp -o value guid "$bak/data/docs@$snap")
  [[ "$a" == "$b" ]] || fail "guid mismatch for @$snap: $a != $b"
done
echo "guids equal for every snapshot of $src/data/docs"
# Read-only: reading a mounted replica updates atimes, and a replica written to since its newest
# snapshot refuses the next incremental ("destination ... has been modified").
zfs set readonly=on "$bak/data"
zfs mount "$bak/data/docs" 2>/dev/null || true
diff -r --no-dereference "$work/mnt/$src/data/docs" "$(zfs get -H -o value mountpoint "$bak/data/docs")" \
  || fail "the replica's files differ from the source"
echo "replica files identical to the source"

step "archive to a file:// store: a full of the oldest snapshot, then -I to the newest"
mkdir -p "$work/cold"
zbak archive --dry-run
zbak archive
cp -a /usr/share/common-licenses "$work/mnt/$src/data/docs/licenses-before-second-archive"
sleep 1.1
zbak snapshot demo
zbak archive demo   # an incremental on each chain
zbak list streams demo
find "$work/cold" -name manifest.json | sort

step "restore the docs from the archive into a new dataset and compare with the source snapshot"
docs_snap=$(zfs list -H -t snapshot -o name -s createtxg -r "$src/data/docs" | tail -1 | sed 's/^[^@]*@//')
zbak restore "$src/data/docs" --to "@$docs_snap" --into "$src/restored-docs" --dry-run
zbak restore "$src/data/docs" --to "@$docs_snap" --into "$src/restored-docs" --from cold --yes
# guids in full: zfs-fuse has no `zfs list -p` (its `list -o guid` rounds: "12.4E") nor `get -t`
zfs get -H -p -r -o name,value guid "$src/restored-docs" | grep @
[[ "$(zfs get -Hp -o value guid "$src/restored-docs@$docs_snap")" == "$(zfs get -Hp -o value guid "$src/data/docs@$docs_snap")" ]] \
  || fail "restored @$docs_snap has another guid than the source's"
echo "restored @$docs_snap has the source snapshot's guid"
zfs mount "$src/restored-docs" 2>/dev/null || true
zfs clone "$src/data/docs@$docs_snap" "$src/compare-docs"   # zfs-fuse has no .zfs/snapshot
diff -r --no-dereference "$(zfs get -H -o value mountpoint "$src/compare-docs")" \
     "$(zfs get -H -o value mountpoint "$src/restored-docs")" || fail "restored files differ from the source snapshot"
echo "restored files identical to the source snapshot"
retry zfs destroy "$src/compare-docs"

step "rsync fallback: the site as hard-linked point-in-time trees"
sleep 1.1
zbak snapshot mirror
zbak replicate mirror
ls -l "$work/rsync-mirror" "$work/rsync-mirror/snapshots"
diff -r --no-dereference "$work/mnt/$src/site" "$work/rsync-mirror/current/" || fail "the rsync mirror differs"
echo "rsync mirror identical to the source"

step "retention: hold one old snapshot, clone another, then prune"
mapfile -t ours < <(zfs list -H -o name -t snapshot -r "$src/data" | grep "^$src/data@zbak_")
zfs hold keep-for-audit "${ours[0]}"
zfs clone "${ours[1]}" "$src/restored-copy"
zbak prune demo --dry-run
zbak prune
zfs list -t snapshot -o name,userrefs -r "$src/data"
retry zfs destroy "$src/restored-copy"
zfs release keep-for-audit "${ours[0]}"

step "status"
zbak status
step "audit: the chain graph, every object in the store, and a deep re-read of every volume"
zbak audit --deep
zbak list streams demo

# The daemon phase's checks read its log (human format: zrepl_py/daemon/logs.py), the catalog's
# runs table and `zbak status --json`. Modes:
#   wait LOG PID MIN MAX CHURN: return at the first quiet moment after MIN seconds: every action
#     of every job has run, no run is due or running (so the demo job's newest snapshot is
#     replicated and archived), and the next runs are >= 1.5 s away: SIGTERM then interrupts
#     nothing and every newest run stays ok; fail after MAX seconds
#   check LOG RUNS_BEFORE: every run the log shows ended "done", none overlapped another of the
#     same job, each has ok rows in the catalog (ids above RUNS_BEFORE), none failed there
#   status: stdin is `zbak status --json`: every job, action and target has a last success
#     and its newest run is ok, nothing is running
daemon_check() { "$root/.venv/bin/python" "$work/daemon_check.py" "$work/zbak.toml" "$@"; }
cat > "$work/daemon_check.py" <<'PY'
import collections, json, math, os, re, sqlite3, sys, time
from pathlib import Path

from zrepl_py.config.loading import load_config
from zrepl_py.daemon.plan import INTERVAL_ORIGIN, plan_entries

config = load_config(Path(sys.argv[1]))
mode, args = sys.argv[2], sys.argv[3:]
planned = [(e.job, e.action) for e in plan_entries(config)]
RUN = re.compile(r"^\S+ (\w+) zrepl_py\.daemon\.scheduler: \[(\S+) (\S+)\] (.*)$")
ENDS = ("done in", "not started", "interrupted", "skipped", "audit found", "waiting for", "failed with")


def events(log):
    for line in Path(log).read_text(errors="replace").splitlines():
        match = RUN.match(line)
        if match:
            yield match[2], match[3], match[4]


def tally(log):
    due, ended, done, seconds, last = (collections.Counter(), collections.Counter(),
                                       collections.Counter(), collections.Counter(), {})
    for n, (job, action, message) in enumerate(events(log)):
        key = (job, action)
        if message.startswith("due at"):
            due[key] += 1
        elif message.startswith(ENDS):
            ended[key] += 1
        if message.startswith("done in"):
            done[key] += 1
            seconds[key] += float(message.split()[2])
            last[key] = n
    return due, ended, done, seconds, last


def problem(text):
    print(f"demo: FAILED: {text}", file=sys.stderr)
    sys.exit(1)


if mode == "wait":
    log, pid, least, most, churn = args[0], int(args[1]), float(args[2]), float(args[3]), Path(args[4])
    intervals = [every.total_seconds() for every in config.daemon.every.values()]
    began = time.monotonic()
    shown = 0.0
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            problem(f"the daemon exited early:\n{Path(log).read_text()[-3000:]}")
        elapsed = time.monotonic() - began
        due, ended, done, _, last = tally(log)
        if elapsed - shown >= 10:
            shown = elapsed
            per_action = collections.Counter()
            for (job, action), count in done.items():
                per_action[action] += count
            changes = churn.read_text().strip() if churn.exists() else "0"
            print(f"  {elapsed:4.0f} s: runs done (both jobs) {dict(sorted(per_action.items()))}, "
                  f"{changes} file changes so far", flush=True)
        since_origin = time.time() - INTERVAL_ORIGIN.timestamp()
        to_next = min(math.ceil(since_origin / i) * i - since_origin for i in intervals)
        if (elapsed >= least and all(done[k] for k in planned) and due == ended
                and last.get(("demo", "replicate"), -1) > last.get(("demo", "snapshot"), 0)
                and to_next >= 1.5):
            print(f"  {elapsed:4.0f} s: every action ran, nothing running or due: stopping")
            break
        if elapsed > most:
            problem(f"no quiet moment with every action done within {most:.0f} s: "
                    f"done {dict(done)}, due {dict(due)}, ended {dict(ended)}")
        time.sleep(0.1)

elif mode == "check":
    log, before = args[0], int(args[1])
    failures = []
    due, ended, done, seconds, _ = tally(log)
    running = {}
    for job, action, message in events(log):
        if message.startswith("started"):
            if job in running:
                failures.append(f"{job} {action} started while {job} {running[job]} was running")
            running[job] = action
        elif message.startswith(ENDS):
            running.pop(job, None)
            if not message.startswith("done in"):
                failures.append(f"{job} {action}: {message}")
    text = Path(log).read_text(errors="replace")
    failures += [f"log: {line}" for line in text.splitlines()
                 if " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback")]
    if "zrepl_py.daemon.scheduler: daemon stopped" not in text:
        failures.append("the log does not end with 'daemon stopped'")
    failures += [f"{j} {a} never ran" for j, a in planned if not done[j, a]]
    failures += [f"{j} {a}: {due[j, a]} due, {ended[j, a]} ended" for j, a in due
                 if due[j, a] != ended[j, a]]
    with sqlite3.connect(config.state_dir / "catalog.sqlite") as db:
        rows = db.execute("SELECT job, action, result, count(*) FROM runs WHERE id > ? "
                          "GROUP BY job, action, result", (before,)).fetchall()
    recorded = collections.Counter()
    for job, action, result, count in rows:
        if result == "ok":
            recorded[job, action] += count
        else:
            failures.append(f"catalog: {count} {job} {action} run(s) {result}")
    print(f"{'job':8} {'action':10} {'runs':>4} {'mean s':>6} {'catalog rows ok':>15}")
    for job, action in planned:
        key = (job, action)
        mean = seconds[key] / done[key] if done[key] else 0.0
        print(f"{job:8} {action:10} {done[key]:4} {mean:6.1f} {recorded[key]:15}")
        if recorded[key] < done[key]:
            failures.append(f"{job} {action}: {done[key]} runs done but {recorded[key]} recorded")
    if failures:
        problem("\n  ".join(["daemon run problems:", *failures]))
    print(f"{sum(done.values())} scheduled runs, all done, none overlapping, all recorded ok")

elif mode == "status":
    failures = []
    for job in json.load(sys.stdin):
        ok = {(s["action"], s["target"]) for s in job["last_success"]}
        failures += [f"{job['job']} {a}: no success" for a in job["next_runs"]
                     if not any(action == a for action, _ in ok)]
        failures += [f"{job['job']} {r['action']} {r['target'] or ''}: newest run {r['result']}"
                     for r in job["last_runs"] if r["result"] != "ok"]
        failures += [f"{job['job']} -> {t['target']}: last {t['last_result']}, last success "
                     f"{t['last_success']}" for t in job["targets"]
                     if t["last_result"] != "ok" or t["last_success"] is None]
        failures += [f"{job['job']} {r['action']} still running" for r in job["running"]]
        print(f"{job['job']}: {len(job['last_success'])} actions/targets with a last success, "
              f"{len(job['last_runs'])} newest runs all ok, targets "
              + ", ".join(f"{t['target']} lag {t['lag_snapshots']} snapshot(s)" for t in job["targets"]))
    if failures:
        problem("\n  ".join(["status problems:", *failures]))
PY

step "the daemon: every action on a seconds-scale schedule while the data keeps changing"
cat >> "$work/zbak.toml" <<TOML

# For this demo only: every action of every job every 30 s instead of its cron line; actions due
# together run one at a time per dataset, snapshot first and audit last.
[daemon]
every = { snapshot = "30s", replicate = "30s", archive = "30s", prune = "30s", audit = "30s" }
stop_timeout = "20s"
TOML
tail -4 "$work/zbak.toml"
zbak config check
before_daemon=$(zfs list -H -t snapshot -o name -s createtxg -r "$src/data/docs" | grep '@zbak_' | tail -1)
runs_before=$("$root/.venv/bin/python" -c 'import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute("SELECT coalesce(max(id), 0) FROM runs").fetchone()[0])' "$work/state/catalog.sqlite")

churn() {  # files added, modified and deleted in every dataset every second or two
  set +e  # a file vanishing under the loop is no reason to stop changing the data
  local docs=$work/mnt/$src/data/docs i=0 n=0
  mkdir -p "$docs/churn"
  while :; do
    i=$((i + 1))
    head -c $((RANDOM % 50000 + 1)) /dev/urandom > "$docs/churn/new-$i.bin"
    echo "change $i at $(date -u +%T.%N)" >> "$docs/churn/changes.log"
    echo "root dataset change $i" >> "$work/mnt/$src/data/root-notes.txt"
    echo "site change $i" > "$work/mnt/$src/site/news-$((i % 5)).txt"
    n=$((n + 4))
    if ((i % 3 == 0)); then printf 'edited in round %d\n' "$i" >> "$docs/churn/new-$((i - 2)).bin"; n=$((n + 1)); fi
    if ((i > 4)); then rm -f "$docs/churn/new-$((i - 4)).bin"; n=$((n + 1)); fi
    if ((i % 4 == 0)); then  # a whole package's docs deleted
      victim=$(find "$docs" -mindepth 1 -maxdepth 1 -type d ! -name churn | sort | head -1)
      [[ -n "$victim" ]] && rm -rf "$victim" && n=$((n + 1))
    fi
    echo "$n" > "$work/churn.count"
    sleep "1.$((RANDOM % 10))"
  done
}
churn &
churn_pid=$!

printf '$ zbak daemon 2> %s &\n' "$work/daemon.log"
"$root/.venv/bin/zbak" --config "$work/zbak.toml" daemon 2> "$work/daemon.log" &
daemon_pid=$!
daemon_check wait "$work/daemon.log" "$daemon_pid" 25 100 "$work/churn.count"
printf '$ kill -TERM %s\n' "$daemon_pid"
stop_began=${EPOCHREALTIME/./}
kill -TERM "$daemon_pid"
daemon_status=0
wait "$daemon_pid" || daemon_status=$?
daemon_pid=
echo "zbak daemon exited $daemon_status, $(( (${EPOCHREALTIME/./} - stop_began) / 1000 )) ms after SIGTERM"
[[ "$daemon_status" == 0 ]] || fail "zbak daemon exited $daemon_status on SIGTERM"
kill "$churn_pid" && wait "$churn_pid" 2>/dev/null || true
churn_pid=
leftover=$(pgrep -af "zrepl_py --config $work/zbak.toml" || true)
[[ -z "$leftover" ]] || fail "daemon children still running: $leftover"

step "the daemon's log ($work/daemon.log): the scheduled runs"
grep -F 'zrepl_py.daemon.scheduler:' "$work/daemon.log"   # its runs' own lines are in between
daemon_check check "$work/daemon.log" "$runs_before"

step "status after the daemon: every job, action and target has a last success, none failed"
zbak status
printf '$ zbak status --json | (check)\n'
"$root/.venv/bin/zbak" --config "$work/zbak.toml" status --json | daemon_check status

step "restore the daemon's newest snapshot from the replica into a new dataset"
newest=$(zfs list -H -t snapshot -o name -s createtxg -r "$src/data/docs" | grep '@zbak_' | tail -1)
newest=${newest#*@}
[[ "$src/data/docs@$newest" > "$before_daemon" ]] || fail "no snapshot by the daemon (newest is @$newest)"
echo "newest snapshot taken by the daemon: @$newest"
zbak restore "$src/data/docs" --to "@$newest" --into "$src/daemon-restored" --from backup --yes
guid_src=$(zfs get -Hp -o value guid "$src/data/docs@$newest")
guid_restored=$(zfs get -Hp -o value guid "$src/daemon-restored@$newest")
[[ "$guid_src" == "$guid_restored" ]] || fail "restored @$newest has guid $guid_restored, the source $guid_src"
echo "restored @$newest has the source snapshot's guid $guid_src"
zfs mount "$src/daemon-restored" 2>/dev/null || true
zfs clone "$src/data/docs@$newest" "$src/compare-daemon"
diff -r --no-dereference "$(zfs get -H -o value mountpoint "$src/compare-daemon")" \
     "$(zfs get -H -o value mountpoint "$src/daemon-restored")" || fail "restored files differ from @$newest"
echo "restored files identical to the source at @$newest ($(find "$(zfs get -H -o value mountpoint "$src/daemon-restored")/churn" -type f | wc -l) churn files in it)"
retry zfs destroy "$src/compare-daemon"

step "audit after the daemon: chains, objects and a deep re-read of every volume"
zbak audit --deep
step "done: the manual and the unattended cycle completed"
