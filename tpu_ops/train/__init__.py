"""Training that survives preemption: checkpoint finder, job contract, supervisor, goodput."""
