#!/usr/bin/env bash
# Smoke test of the real terminal app: start `ssdmoe` (the demo model) in a detached
# tmux pane, send a prompt, and check the reply and the engine panel on screen, then
# the conversations list (ctrl+o) and the model picker (F4).
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

"${T[@]}" new-session -d -s "$SESSION" -x 120 -y 40 \
    "cd '$ROOT' && sleep 0.5 && SSDMOE_HOME='$HOME_DIR' TERM=xterm-256color '$SSDMOE' --max-tokens 40; echo SSDMOE-EXITED \$?; sleep 60"
# Without a client attached, tmux may size the window from its defaults: pin 120x40.
"${T[@]}" set-option -t "$SESSION" window-size manual
"${T[@]}" resize-window -t "$SESSION" -x 120 -y 40

wait_for "Loaded demo-model" "$LOAD_TIMEOUT"
wait_for "experts per token" 5

"${T[@]}" send-keys -t "$SESSION" -l "hello from tmux"
sleep 0.5
"${T[@]}" send-keys -t "$SESSION" Enter
wait_for "hello from tmux" 10
# The reply header gets "N tokens · X tok/s" once the reply has finished streaming.
wait_for "tok/s" "$REPLY_TIMEOUT"
start=$SECONDS
until pane | grep -qE "^ ▌ demo-model .*[0-9]+ tokens"; do
    (( SECONDS - start >= REPLY_TIMEOUT )) && fail "the reply never finished"
    sleep 0.5
done

screen="$(pane)"
for label in "decode" "prefill (last turn)" "SSD read" "hit rate" "used / budget" \
    "weights (resident)" "KV cache" "process RSS" "peak RSS" "KV hit (this turn)" \
    "context" "K 4 of 32" "cpu" "cache "; do
    grep -qF -- "$label" <<<"$screen" || fail "panel label '$label' missing"
done
grep -qE "decode +[1-9][0-9]*\.[0-9] tok/s" <<<"$screen" || fail "decode tok/s is not above zero"
grep -qF "Traceback" <<<"$screen" && fail "a traceback is on screen"

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

"${T[@]}" send-keys -t "$SESSION" C-q
wait_for "SSDMOE-EXITED" 20
code="$(pane | sed -n 's/.*SSDMOE-EXITED \([0-9]*\).*/\1/p' | tail -1)"
[ "$code" = "0" ] || fail "ssdmoe exited with status $code after ctrl+q"

echo "tmux_smoke: OK"
