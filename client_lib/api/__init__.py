"""The admin and REST APIs: routes and bodies declared once, signed calls,
and the clients; the serving side is `client_lib.server`."""
