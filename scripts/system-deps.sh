#!/bin/sh
# Debian packages the demo and the browser test use: the real Fashion-MNIST images (demo
# collages) and Chromium + ChromeDriver (Playwright drives the system browser). Installed
# when apt-get is there and we may use it; otherwise the Fashion-MNIST loader downloads the
# official files and the browser test skips with its reason.
pkgs="dataset-fashion-mnist chromium chromium-driver"
missing=""
for p in $pkgs; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "installing Debian packages:$missing"
  (apt-get update -qq && apt-get install -y -qq $missing >/dev/null) \
    || echo "could not install$missing; the demo downloads Fashion-MNIST instead" >&2
else
  echo "not installing$missing (needs apt-get as root); see README" >&2
fi
exit 0
