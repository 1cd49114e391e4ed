"""What every service shares: settings, the bus connection, lifecycle, logs, health."""
