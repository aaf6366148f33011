#!/bin/bash
# Attack 9: the harness's own toolchain and restart marker (read-only mount, mount points).
{
  cp /bin/sh /busybox-trialflow && echo "overwrote the toolchain"
  rm -f /busybox-trialflow && echo "removed the toolchain"
  mv /busybox-trialflow /x && echo "moved the toolchain"
  mv /.trialflow-state /y && echo "moved the state dir"
  mkdir -p /.trialflow-state/verify
} > /app/tamper.txt 2>&1
exit 0
