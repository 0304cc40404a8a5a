"""PartIR:HLO: device-local programs with explicit collectives over mesh axes (paper 1 §6)."""
