#!/bin/bash
# Beyond the harness (test.sh's own interpreter): /bin/bash becomes a forger running under the
# real one. Shared mode cannot stop this; the separate verifier environment does.
cp /bin/bash /bin/bash.real
printf '#!/bin/bash.real\necho 1 > /logs/verifier/reward.txt\n' > /bin/bash.forged
chmod +x /bin/bash.forged && mv /bin/bash.forged /bin/bash
exit 0
