#!/usr/bin/env bash
# Smoke test of the real terminal app: start `ssdmoe` (the demo model) in a detached
# tmux pane, check the first-run screen, send a prompt, and check the reply and the
# engine panel on screen, then the conversations list (ctrl+o) and the model picker
# (F4); then the app again at 80x24, where every panel figure must be on screen.
# Exits non-zero (printing the pane) on failure. Uses the repo's .venv unless
# SSDMOE_PYTHON_BIN points at another bin/ folder; SSDMOE_HOME is a fresh temp dir.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${SSDMOE_PYTHON_BIN:-$ROOT/.venv/bin}"
SSDMOE="$BIN/ssdmoe"
LOAD_TIMEOUT="${LOAD_TIMEOUT:-180}"
REPLY_TIMEOUT="${REPLY_TIMEOUT:-90}"

command -v tmux >/dev/null || { echo "tmux_smoke: tmux is not installed" >&2; exit 2; }
[ -x "$SSDMOE" ] || { echo "tmux_smoke: $SSDMOE not found (make setup?)" >&2; exit 2; }

HOME_DIR="$(mktemp -d "${TMPDIR:-/tmp}/ssdmoe-smoke.XXXXXX")"
SOCKET="ssdmoe-smoke-$$"
SESSION="smoke"
T=(tmux -L "$SOCKET" -f /dev/null)

cleanup() {
    "${T[@]}" kill-server 2>/dev/null || true
    rm -rf "$HOME_DIR"
}
trap cleanup EXIT

pane() { "${T[@]}" capture-pane -p -t "$SESSION" 2>/dev/null || true; }

fail() {
    echo "tmux_smoke: FAIL: $*" >&2
    echo "----- pane -----" >&2
    pane >&2
    echo "----------------" >&2
    exit 1
}

# Wait until the pane contains a fixed string (grep -F), or fail after $2 seconds.
wait_for() {
    local needle="$1" timeout="$2" start=$SECONDS
    until pane | grep -qF -- "$needle"; do
        (( SECONDS - start >= timeout )) && fail "no '$needle' on screen after ${timeout}s"
        sleep 0.5
    done
}

start_app() {  # $1 x $2: terminal size
    "${T[@]}" new-session -d -s "$SESSION" -x "$1" -y "$2" \
        "cd '$ROOT' && sleep 0.5 && SSDMOE_HOME='$HOME_DIR' TERM=xterm-256color '$SSDMOE' --max-tokens 40; echo SSDMOE-EXITED \$?; sleep 60"
    # Without a client attached, tmux may size the window from its defaults: pin it.
    "${T[@]}" set-option -t "$SESSION" window-size manual
    "${T[@]}" resize-window -t "$SESSION" -x "$1" -y "$2"
}

quit_app() {
    "${T[@]}" send-keys -t "$SESSION" C-q
    wait_for "SSDMOE-EXITED" 20
    code="$(pane | sed -n 's/.*SSDMOE-EXITED \([0-9]*\).*/\1/p' | tail -1)"
    [ "$code" = "0" ] || fail "ssdmoe exited with status $code after ctrl+q"
}

start_app 120 40
# First run: the welcome panel says what happens and what the demo is, at once.
wait_for "demo model: tiny, trained here" 10
wait_for "It knows little" 2
wait_for "A real model: F4 here" 2
wait_for "ssdmoe --model mlx-community/Qwen3-30B-A3B-4bit" 2

wait_for "Loaded demo-model" "$LOAD_TIMEOUT"
wait_for "experts per token" 5

# Send a prompt and wait for its reply to finish: the status bar (first line) leaves
# "idle" while it streams and ends on it again, and the reply's header ends with the K
# it used ("… N tokens · X tok/s · K 4"; the line may wrap on a small screen).
chat_once() {
    "${T[@]}" send-keys -t "$SESSION" -l "$1"
    sleep 0.5
    "${T[@]}" send-keys -t "$SESSION" Enter
    wait_for "$1" 10
    local start=$SECONDS
    until pane | head -1 | grep -qvE "idle *$"; do  # a very fast reply may be missed here
        (( SECONDS - start >= 10 )) && break
        sleep 0.2
    done
    start=$SECONDS
    until pane | head -1 | grep -qE "idle *$" && pane | grep -qE "tok/s · K [0-9]+|^ *▌ · K [0-9]+"; do
        (( SECONDS - start >= REPLY_TIMEOUT )) && fail "the reply to '$1' never finished"
        sleep 0.5
    done
}

# Every label on screen at once (no scrolling): check_on_screen WHERE LABEL...
check_on_screen() {
    local where="$1" screen
    shift
    screen="$(pane)"
    for label in "$@"; do
        grep -qF -- "$label" <<<"$screen" || fail "$where: '$label' is not on screen"
    done
    grep -qF "Traceback" <<<"$screen" && fail "$where: a traceback is on screen"
    return 0
}

PANEL=("decode" "prefill (last)" "read from SSD" "from page cache" "router mass kept" "cache hit rate"
    "cache used" "weights" "KV cache" "process RSS" "peak RSS" "KV hit (turn)" "context")

chat_once "hello from tmux"
check_on_screen "120x40" "${PANEL[@]}" "K 4 of 32" "cpu" "cache "
screen="$(pane)"
grep -qE "decode +[1-9][0-9]*\.[0-9] tok/s" <<<"$screen" || fail "decode tok/s is not above zero"

# ctrl+o lists the conversation just saved; F4 lists the models found.
"${T[@]}" send-keys -t "$SESSION" C-o
wait_for "Search titles and messages" 10
wait_for "demo-model · 1 turn" 10
"${T[@]}" send-keys -t "$SESSION" Escape
sleep 0.5
"${T[@]}" send-keys -t "$SESSION" F4
wait_for "Switch model" 10
wait_for "MiB/token" 20
"${T[@]}" send-keys -t "$SESSION" Escape
sleep 0.5

quit_app

# 80x24 (a fresh start: resizing a running pane can leave tmux's copy of the screen
# half redrawn): the compact panel shows every figure at once, the header keeps K,
# cache and phase, and no label runs into its value.
SESSION="smoke-80x24"  # a second window: the first one keeps the tmux server up
start_app 80 24
# The welcome card's top stays in view (the "Loaded" notice is below it, off screen).
wait_for "demo model: tiny, trained here" 10
wait_for "A real model: F4 here" 2
wait_for "demo-model is ready" "$LOAD_TIMEOUT"
chat_once "small screen"
check_on_screen "80x24" "${PANEL[@]}" "K 4/32" "cache " "idle"
grep -qE "[a-z)][0-9]+\.[0-9] tok/s" <<<"$(pane)" && fail "80x24: a label runs into its value"
quit_app

echo "tmux_smoke: OK"
