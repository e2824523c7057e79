#!/usr/bin/env bash
# Creates .venv with a Python >= 3.12 found on this machine, installs ctproxy with its test extra,
# and installs Codex CLI (npm) into .tools/ for the end-to-end tests. Idempotent and quick when done.
set -euo pipefail
cd "$(dirname "$0")/.."

CODEX_VERSION="0.169.0"

find_python() {
  local candidates=()
  [ -n "${CTPROXY_PYTHON:-}" ] && candidates+=("$CTPROXY_PYTHON")
  candidates+=(python3.13 python3.12)
  local root="${PYENV_ROOT:-}"
  [ -z "$root" ] && command -v pyenv >/dev/null 2>&1 && root="$(pyenv root 2>/dev/null || true)"
  [ -z "$root" ] && root="$HOME/.pyenv"
  if [ -d "$root/versions" ]; then
    for v in $(ls -1 "$root/versions" | grep -E '^3\.(1[2-9])(\.[0-9]+)?$' | sort -t. -k2,2nr -k3,3nr); do
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

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys; sys.exit(0 if sys.version_info >= (3,12) else 1)'; then
  PY="$(find_python)" || { echo "bootstrap: no Python >= 3.12 found (tried python3.13, python3.12, pyenv versions, python3); install one or set CTPROXY_PYTHON" >&2; exit 1; }
  echo "bootstrap: creating .venv with $PY ($("$PY" --version))"
  rm -rf .venv
  "$PY" -m venv .venv
fi

STAMP=".venv/.ctproxy-installed"
HASH="$(cat pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$HASH" ]; then
  echo "bootstrap: installing ctproxy and its test dependencies into .venv"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
  echo "$HASH" > "$STAMP"
  echo "bootstrap: installed; the command is .venv/bin/ctproxy (not on PATH: source .venv/bin/activate, or make ctproxy ARGS=\"status\")"
fi

if [ "${CTPROXY_SKIP_CODEX:-0}" != "1" ] && [ ! -x .tools/node_modules/.bin/codex ]; then
  if command -v npm >/dev/null 2>&1; then
    echo "bootstrap: installing Codex CLI $CODEX_VERSION into .tools/ (used by the end-to-end tests)"
    mkdir -p .tools
    (cd .tools && npm install --silent --no-audit --no-fund --prefix . "@openai/codex@$CODEX_VERSION" >/dev/null) \
      || echo "bootstrap: warning: could not install Codex CLI; its test will be reported as failed" >&2
  else
    echo "bootstrap: warning: npm not found; the Codex CLI test needs it" >&2
  fi
fi

# Computer Use on Linux and its tests: an X server, input, the AT-SPI bus, a window manager, and GTK for the
# test app (tests/apps/cu_app.py). One dpkg-query when all are there; apt-get only for what is missing.
CU_DEBS="xvfb xdotool openbox at-spi2-core dbus-daemon dbus-session-bus-common python3-gi gir1.2-gtk-3.0"
if [ "${CTPROXY_SKIP_DESKTOP:-0}" != "1" ] && command -v dpkg-query >/dev/null 2>&1; then
  # shellcheck disable=SC2086
  CU_MISSING="$(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' $CU_DEBS 2>/dev/null | awk '$2 == "ii" {print $1}' \
    | sort | comm -13 - <(tr ' ' '\n' <<<"$CU_DEBS" | sort) | tr '\n' ' ')"
  if [ -n "${CU_MISSING// /}" ]; then
    APT=""
    if [ "$(id -u)" = "0" ]; then APT="apt-get"; elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then APT="sudo apt-get"; fi
    if [ -n "$APT" ] && command -v apt-get >/dev/null 2>&1; then
      echo "bootstrap: installing Debian packages for Computer Use: $CU_MISSING"
      # shellcheck disable=SC2086
      { $APT update -qq && DEBIAN_FRONTEND=noninteractive $APT install -y -qq --no-install-recommends $CU_MISSING; } \
        >/dev/null 2>&1 || echo "bootstrap: warning: could not install $CU_MISSING; the Computer Use desktop tests will be skipped" >&2
    else
      echo "bootstrap: warning: missing Debian packages $CU_MISSING and apt-get is not usable here; the Computer Use desktop tests will be skipped" >&2
    fi
  fi
fi

# The dashboard's browser test (tests/test_dashboard.py): Debian's chromium, driven by Playwright for Python
# (installed with the test extra, without Playwright's own browser downloads).
if [ "${CTPROXY_SKIP_BROWSER:-0}" != "1" ] && [ ! -x /usr/bin/chromium ]; then
  APT=""
  if [ "$(id -u)" = "0" ]; then APT="apt-get"; elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then APT="sudo apt-get"; fi
  if [ -n "$APT" ] && command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing Debian's chromium (the dashboard's browser test)"
    { $APT update -qq && DEBIAN_FRONTEND=noninteractive $APT install -y -qq --no-install-recommends chromium; } \
      >/dev/null 2>&1 || echo "bootstrap: warning: could not install chromium; the dashboard browser test will fail" >&2
  else
    echo "bootstrap: warning: /usr/bin/chromium is missing and apt-get is not usable here; the dashboard browser test will fail" >&2
  fi
fi
