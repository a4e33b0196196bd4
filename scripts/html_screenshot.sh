#!/bin/sh
# Screenshot a gpudiag HTML report with headless Chromium, offline, to check how it looks.
#   scripts/html_screenshot.sh REPORT.html OUT.png [WIDTH] [HEIGHT]
# Needs `chromium` (Debian: apt-get install -y chromium). Network is off: the page must
# need nothing from outside (--disable-background-networking, a proxy that goes nowhere).
set -eu
html=$1
png=$2
w=${3:-1100}
h=${4:-3000}
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome)
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
"$browser" --headless --no-sandbox --disable-gpu --disable-background-networking \
  --no-first-run --user-data-dir="$profile" --proxy-server="127.0.0.1:9" \
  --hide-scrollbars --window-size="$w,$h" --screenshot="$png" \
  "file://$(realpath "$html")" >/dev/null 2>&1
test -s "$png"
