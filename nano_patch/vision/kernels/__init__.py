"""The kernels: the compiled extensions' loading, checks and wrappers, torch's generator reproduced natively, and the
PIL-exact functions on arrays (``functional``). Pure functions of arrays: no patching, no state beyond the loaded
extensions."""
