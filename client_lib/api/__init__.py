"""The admin and REST APIs: routes and bodies declared once, signed calls, both ends."""
