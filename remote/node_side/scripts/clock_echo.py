"""Answer each line on stdin with this node's clock.

Started first and pinged once ready, so neither SSH channel setup nor Python's start-up lands in
a round trip.
"""

import sys, time
sys.stdout.write("ready\n"); sys.stdout.flush()
while sys.stdin.readline():
    sys.stdout.write(repr(time.time()) + "\n"); sys.stdout.flush()
