#!/bin/bash
# Attack 8: make the verification restart fail (the engine's init is mounted at /sbin/docker-init).
rm -f /sbin && touch /sbin
exit 0
