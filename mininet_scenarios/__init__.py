"""MetaFlow on Mininet: topologies, scenarios, the demo, the nemesis.

Mininet's `mininet.log`, on import, makes its own logger class the class of
every logger created afterwards (``logging.setLoggerClass(MininetLogger)``):
each new logger then carries its own console handler and Mininet's level,
above INFO, so the INFO records of any logger first named after Mininet was
imported never reach the root logger's handlers. In a scenario that hides
the daemons' helpers' logs; in a test process it hid whatever a later test
logged (pytest's caplog saw nothing, depending on which test ran first on a
worker). The package puts the standard class back as soon as it is imported,
before any of its modules imports Mininet's."""

import logging

try:
    import mininet.log  # noqa: F401  (imported for its side effect, which is undone below)
except ImportError:   # a module of this package that needs Mininet says so itself
    pass
else:
    logging.setLoggerClass(logging.Logger)
