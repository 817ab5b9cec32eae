"""Recovery without a human: `orch watch`, the controller that asks a provider for a replacement
machine when a job's owner lease in the mirror lapses. Never imports torch; never runs jobs."""
