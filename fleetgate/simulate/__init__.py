"""The fleet simulator: fleetgate's own request lifecycle over simulated engines in virtual
time (`fleetgate simulate`)."""
