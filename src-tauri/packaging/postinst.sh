#!/bin/sh
# speedtap's Debian package, after install: give the packet capture helper
# the one capability it needs to read loopback packets (`speedtap run
# --capture`). Without setcap the proxy still works; capture stays off and
# says which command grants it.
set -e
HELPER=/usr/bin/speedtap-capture
if [ "$1" = configure ] && [ -f "$HELPER" ]; then
  if command -v setcap >/dev/null 2>&1; then
    setcap cap_net_raw=eip "$HELPER" || echo "speedtap: could not run setcap on $HELPER; capture stays off (sudo setcap cap_net_raw=eip $HELPER)" >&2
  else
    echo "speedtap: setcap not found (package libcap2-bin); capture stays off until: sudo setcap cap_net_raw=eip $HELPER" >&2
  fi
fi
exit 0
