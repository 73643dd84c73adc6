"""What the bridge keeps about a training run, without Lightning: the step clock, the checkpoint
entry, the plan, the cost report, and which run owns an algorithm instance.

These modules import the engine core and the algorithms, never Lightning; the Lightning adapter
(:mod:`composer_bridge.lightning`) builds on them.
"""
