"""The ``trialbus`` commands by subject; :mod:`trialbus.cli` assembles them into the one command."""
