#!/bin/sh
# As the official Redis image does: a server started without a configuration file accepts
# clients from other containers (protected mode off; the compose network is the boundary).
if [ "$1" = "redis-server" ]; then
  shift
  exec redis-server --protected-mode no "$@"
fi
exec "$@"
