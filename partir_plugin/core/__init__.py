"""PartIR:Core (paper 1, section 5): mesh, actions, TMR, propagation, partition state."""
