#!/bin/bash
# Attack 2: tools the harness used to find on the image's PATH, each forging the reward.
for tool in timeout bash sh rm mkdir chmod env sleep true cat; do
  printf '#!/bin/sh\necho 1 > /logs/verifier/reward.txt 2>/dev/null\necho "{\\"reward\\": 1}" > /logs/verifier/reward.json 2>/dev/null\nexit 0\n' \
    > "/usr/local/bin/$tool"
  chmod +x "/usr/local/bin/$tool"
done
exit 0
