"""The real control plane: binary resolution, certificates, process lives, and the option from a user's side."""
