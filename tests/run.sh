#!/usr/bin/env bash
# The test command. As root, from anywhere:  bash tests/run.sh [pytest arguments]
#
# Installs what the tests need on a fresh Debian/Ubuntu machine (sshd test nodes, the Docker
# engine, iperf3, ip/tc/iptables for the nodes' namespaces and links, busybox and debootstrap for
# the test images, tmux for the TUI tests, chromium to render the run report and to open the web view
# (driven by playwright, a dev extra from pip that uses this chromium, never a download of its own),
# rsync for the sync benchmark, gcc for the fake libcuda.so.1 of tests/fake_libcuda.py, dbus-daemon and
# gdbus for a node's logind in tests/simlogind.py, zsh and fish whose completion scripts are checked, slurm-wlm
# (slurmctld, slurmd and the clients) and munge for the Slurm cluster of tests/simslurm.py),
# builds .venv with the package and its dev, docs (mkdocs-material: the docs/ site is built by a test) and
# framework extras, then runs pytest: with no arguments the fast tier first (-m fast), and the rest only when it passed.
# Reruns skip the slow steps.
# The Docker engine is started (and stopped again) by the docker_engine fixture, not here.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

die() { echo "tests/run.sh: $*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root: the test cluster is network namespaces running real sshd servers (sudo bash tests/run.sh)"

APT_PACKAGES=(openssh-server docker.io iperf3 iproute2 iptables busybox-static debootstrap tmux ca-certificates
              chromium rsync prometheus gcc dbus-daemon libglib2.0-bin zsh fish slurm-wlm munge)

installed() { [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]; }

missing=()
for package in "${APT_PACKAGES[@]}"; do
    installed "$package" || missing+=("$package")
done
if (( ${#missing[@]} )); then
    echo "tests/run.sh: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${APT_PACKAGES[@]}"
fi
mkdir -p /run/sshd  # sshd's privilege separation directory; it refuses to start without it

# A Python >= 3.11 that can make virtual environments.
find_python() {
    local candidate
    for candidate in python3.13 python3.12 python3.11 python3; do
        if command -v "$candidate" >/dev/null &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            command -v "$candidate"
            return
        fi
    done
    die "no Python >= 3.11 found; install python3 (3.11 or newer)"
}

if ! .venv/bin/python -c 'import sys' 2>/dev/null; then
    rm -rf .venv
    python=$(find_python)
    if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
        installed python3-venv || { apt-get update -q && apt-get install -y -q --no-install-recommends python3-venv; }
    fi
    "$python" -m venv .venv
fi

# Reinstall only when pyproject.toml changed: the editable install picks up code changes itself.
stamp=.venv/.homegpu-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
    .venv/bin/python -m pip install -q -e '.[dev,docs,tensorflow,pytorch,jax]'
    echo "$want" > "$stamp"
fi

# Quiet with a summary of skips and failures, unless the caller chose a verbosity.
defaults=(-q -ra)
for arg in "$@"; do
    case $arg in -v* | -q* | --verbose | --quiet) defaults=(-ra) ;; esac
done
if (( $# )); then
    exec .venv/bin/python -m pytest "${defaults[@]}" "$@"
fi
# The whole suite: the fast tier first (a minute or two), and the rest only when it passed, so a broken fast
# test is said within minutes, not after the LAN tests.
# The Docker test images take minutes on a fresh machine, most of it waiting on the network and the disk
# (debootstrap, pip): they are built beside the fast tier, under the lock the tests' image fixtures take, so a test
# that needs one waits for it, and builds it itself if this failed (and fails, naming why, if that fails too).
images_log=$(mktemp /tmp/homegpu-test-images.XXXXXX.log)
echo "tests/run.sh: building the test images beside the fast tier (python tests/images.py > $images_log)" >&2
.venv/bin/python tests/images.py >"$images_log" 2>&1 &
images=$!
echo "tests/run.sh: the fast tier (pytest -m fast)" >&2
fast=0
.venv/bin/python -m pytest "${defaults[@]}" -m fast -n 2 || fast=$?
if (( fast )); then
    kill -TERM "$images" 2>/dev/null || true
    wait "$images" 2>/dev/null || true
    exit "$fast"
fi
# The rest mostly waits (reconnects, restarts, training on the LAN), so more workers than cores pay:
# HOMEGPU_TEST_WORKERS=N runs it on N pytest-xdist workers (6 by default: on 2 cores, 2 took 56 minutes, 4 took 33),
# each with a LAN of its own
# (tests/simnet.py), with --dist loadscope so a module's tests, which share its cluster, stay on one worker; 1 runs
# it in this process, one test at a time. On 2 cores some LAN tests miss their waits while others train beside
# them, so the tests that failed in parallel are run again, alone and one at a time (pytest --last-failed): the run
# fails when one fails alone too, and the rerun's list says which needed it.
workers=${HOMEGPU_TEST_WORKERS:-6}
if (( workers <= 1 )); then
    echo "tests/run.sh: the fast tier passed; the rest (pytest -m 'not fast')" >&2
    exec .venv/bin/python -m pytest "${defaults[@]}" -m "not fast"
fi
echo "tests/run.sh: the fast tier passed; the rest (pytest -m 'not fast' -n $workers --dist loadscope)" >&2
status=0
timings=$(mktemp --suffix=.xml)
.venv/bin/python -m pytest "${defaults[@]}" -m "not fast" -n "$workers" --dist loadscope --durations=30 \
    --junit-xml="$timings" || status=$?
.venv/bin/python tests/module_times.py "$timings" || true  # the critical path: no module should stand far out
rm -f "$timings"
wait "$images" || echo "tests/run.sh: building the test images beside the fast tier failed (the tests built them" \
    "again): $(tail -n 3 "$images_log")" >&2
(( status == 1 )) || exit "$status"  # 0: all passed; 2-5: interrupted, an internal or usage error, no tests
echo "tests/run.sh: the tests above that failed beside others run again, alone (pytest --last-failed)" >&2
exec .venv/bin/python -m pytest "${defaults[@]}" -m "not fast" --last-failed --last-failed-no-failures none
