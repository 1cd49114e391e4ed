"""``make bench``: the speed figures of the issues, measured on this machine."""
