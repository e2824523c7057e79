#!/usr/bin/env bash
# The set-up behind both README commands. Required: a Python >= 3.12, a virtualenv (.venv) with ctproxy and its
# test dependencies. Optional, installed when this machine allows it and otherwise skipped with one line that
# says what the skip costs: the real clients the end-to-end tests drive (Codex CLI and Pi from npm, the OpenAI
# Agents SDK and litellm from PyPI) and the Debian packages of the desktop (Computer Use) and browser tests, and
# bubblewrap (the shell sandbox), and PostgreSQL (the private server the shared-store tests start).
# What was skipped is written to .venv/ctproxy-setup.json, where the tests read the reason they skip with.
# Idempotent and quick when done; never stops for something optional.
set -euo pipefail
cd "$(dirname "$0")/.."

CODEX_VERSION="0.169.0"
PI_VERSION="0.73.1"
SKIPPED=()   # "key<TAB>what<TAB>reason; cost" for .venv/ctproxy-setup.json (tests/support/optional.py reads it)

say() { echo "bootstrap: $*"; }
# One line per skipped part: what and what it costs. Goes to stderr so it stands out, and into the record.
skip() {
  local key="$1" name="$2" reason="$3" cost="$4"
  echo "bootstrap: skipped $name ($reason); $cost" >&2
  SKIPPED+=("$key"$'\t'"$name: $reason; $cost")
}

find_python() {
  local candidates=()
  [ -n "${CTPROXY_PYTHON:-}" ] && candidates+=("$CTPROXY_PYTHON")
  candidates+=(python3.13 python3.12)
  local root="${PYENV_ROOT:-}"
  [ -z "$root" ] && command -v pyenv >/dev/null 2>&1 && root="$(pyenv root 2>/dev/null || true)"
  [ -z "$root" ] && root="$HOME/.pyenv"
  if [ -d "$root/versions" ]; then
    for v in $(ls -1 "$root/versions" | grep -E '^3\.(1[2-9])(\.[0-9]+)?$' | sort -t. -k2,2nr -k3,3nr || true); do
      candidates+=("$root/versions/$v/bin/python")
    done
  fi
  candidates+=(python3 python)
  for c in "${candidates[@]}"; do
    local exe
    exe="$(command -v "$c" 2>/dev/null || true)"
    [ -z "$exe" ] && [ -x "$c" ] && exe="$c"
    [ -z "$exe" ] && continue
    if "$exe" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
      echo "$exe"; return 0
    fi
  done
  return 1
}

# --- required: the virtualenv and ctproxy ------------------------------------------------------------------
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys; sys.exit(0 if sys.version_info >= (3,12) else 1)'; then
  PY="$(find_python)" || { echo "bootstrap: no Python >= 3.12 found (tried python3.13, python3.12, pyenv versions, python3); install one or set CTPROXY_PYTHON" >&2; exit 1; }
  say "creating .venv with $PY ($("$PY" --version))"
  rm -rf .venv
  "$PY" -m venv .venv
fi

STAMP=".venv/.ctproxy-installed"
HASH="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$HASH" ]; then
  say "installing ctproxy and its test dependencies into .venv"
  if ! { .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip \
         && .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'; }; then
    echo "bootstrap: could not install ctproxy's Python dependencies into .venv (see pip's message above);" \
         "ctproxy needs them: check that PyPI is reachable, or set PIP_INDEX_URL to a mirror, then run make again" >&2
    exit 1
  fi
  echo "$HASH" > "$STAMP"
  rm -f .venv/.ctproxy-clients-installed
  say "installed; the command is .venv/bin/ctproxy (not on PATH: source .venv/bin/activate, or make ctproxy ARGS=\"status\")"
fi

# --- optional: Python clients of the end-to-end tests (pyproject's `clients` extra) ----------------------------
CLIENTS_STAMP=".venv/.ctproxy-clients-installed"
if [ "${CTPROXY_SKIP_CLIENTS:-0}" = "1" ]; then
  for key in openai-agents litellm; do skip "$key" "$key" "CTPROXY_SKIP_CLIENTS=1" "its end-to-end test skips"; done
elif [ ! -f "$CLIENTS_STAMP" ] || [ "$(cat "$CLIENTS_STAMP")" != "$HASH" ]; then
  CLIENT_REQS="$(.venv/bin/python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["clients"]))')"
  say "installing the Python clients the end-to-end tests drive: $(echo $CLIENT_REQS)"
  CLIENTS_FAILED=0
  while IFS= read -r req; do
    [ -z "$req" ] && continue
    if ! .venv/bin/python -m pip install --quiet --disable-pip-version-check "$req" >.venv/pip-clients.log 2>&1; then
      CLIENTS_FAILED=1
      skip "${req%%[<>=!~ ;]*}" "$req" "pip could not install it: $(grep -v '^\s*$' .venv/pip-clients.log | tail -n 1 | cut -c1-160)" \
        "its end-to-end test skips"
    fi
  done <<<"$CLIENT_REQS"
  if [ "$CLIENTS_FAILED" = "0" ]; then echo "$HASH" > "$CLIENTS_STAMP"; fi
fi

# --- optional: npm clients (Codex CLI, Pi) into .tools/ --------------------------------------------------------
npm_client() {  # name, package@version, binary (the record's key), env switch
  local name="$1" spec="$2" bin="$3" switch="$4"
  if [ "${!switch:-0}" = "1" ]; then skip "$bin" "$name" "$switch=1" "its end-to-end tests skip"; return; fi
  [ -x ".tools/node_modules/.bin/$bin" ] && return
  if ! command -v npm >/dev/null 2>&1; then
    skip "$bin" "$name" "npm is not installed (Debian: apt-get install npm)" "its end-to-end tests skip"; return
  fi
  say "installing $name ($spec) into .tools/ (used by the end-to-end tests)"
  mkdir -p .tools
  if ! (cd .tools && npm install --silent --no-audit --no-fund --prefix . "$spec") >.tools/npm-"$bin".log 2>&1 \
     || [ ! -x ".tools/node_modules/.bin/$bin" ]; then
    skip "$bin" "$name" "npm install $spec failed: $(tail -n 1 .tools/npm-"$bin".log | cut -c1-160)" "its end-to-end tests skip"
  fi
}
npm_client "Codex CLI" "@openai/codex@$CODEX_VERSION" codex CTPROXY_SKIP_CODEX
npm_client "Pi" "@mariozechner/pi-coding-agent@$PI_VERSION" pi CTPROXY_SKIP_PI
npm_client "the MCP conformance suite" "@modelcontextprotocol/conformance@0.1.16" conformance CTPROXY_SKIP_MCP_CONFORMANCE

# --- optional: Debian packages of the desktop and browser tests, and the shell sandbox ------------------------------------------------
APT=""
if command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ]; then APT="apt-get"
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then APT="sudo apt-get"; fi
fi
APT_UPDATED=0

missing_debs() {  # prints the packages of "$@" that are not installed; all of them when dpkg-query can't tell
  local p status out=""
  for p in "$@"; do
    status="$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)"
    [ "${status:0:2}" = "ii" ] || out+="$p "
  done
  echo "${out% }"
}

debs() {  # key, name, switch, cost, packages...
  local key="$1" name="$2" switch="$3" cost="$4"; shift 4
  if [ "${!switch:-0}" = "1" ]; then skip "$key" "$name" "$switch=1" "$cost"; return; fi
  local missing
  missing="$(missing_debs "$@")"
  [ -z "$missing" ] && return
  if [ -z "$APT" ]; then
    skip "$key" "$name" "Debian packages $missing are missing and apt-get is not usable here (not root, no sudo, or no apt-get)" "$cost"
    return
  fi
  say "installing Debian packages for $name: $missing"
  if [ "$APT_UPDATED" = "0" ]; then
    $APT update -qq >.venv/apt.log 2>&1 || true
    APT_UPDATED=1
  fi
  # shellcheck disable=SC2086
  if ! DEBIAN_FRONTEND=noninteractive $APT install -y -qq --no-install-recommends $missing >>.venv/apt.log 2>&1; then
    skip "$key" "$name" "apt-get could not install $missing: $(tail -n 1 .venv/apt.log | cut -c1-160)" "$cost"
  fi
}
debs desktop "the Computer Use desktop" CTPROXY_SKIP_DESKTOP \
  "computer_use stays unavailable on this machine and its desktop tests skip" \
  xvfb xdotool openbox at-spi2-core dbus-daemon dbus-session-bus-common python3-gi gir1.2-gtk-3.0
debs chromium "Chromium" CTPROXY_SKIP_BROWSER "the dashboard's browser test skips" chromium
debs sandbox "bubblewrap" CTPROXY_SKIP_SANDBOX "shell sandbox modes are unavailable and their tests skip" bubblewrap
debs postgresql "PostgreSQL" CTPROXY_SKIP_POSTGRES \
  "the tests that start a private PostgreSQL server (the shared store, issue 32) skip" postgresql

# --- the record the tests read ---------------------------------------------------------------------------------
printf '%s\n' "${SKIPPED[@]}" | .venv/bin/python -c '
import json, sys
rows = [line.rstrip("\n").split("\t", 1) for line in sys.stdin if "\t" in line]
json.dump({"skipped": dict(rows)}, open(".venv/ctproxy-setup.json", "w"), indent=1)
'
if [ "${#SKIPPED[@]}" -gt 0 ]; then
  say "done; ${#SKIPPED[@]} optional part(s) skipped (listed above, and in .venv/ctproxy-setup.json); ctproxy itself is complete"
fi
