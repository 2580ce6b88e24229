"""Who decodes when: the scheduler and its lanes, admission and its policies, how longer lanes keep moving, the
jobs it answers, the memory budget, a step's decisions and the threads the lanes run on. No front door, no
document."""
