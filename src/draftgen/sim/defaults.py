"""Constants shared by the server process and its launchers.

Kept apart from server.py so that importing the package (``draftgen.sim``) never imports the module that
``python -m draftgen.sim.server`` runs as ``__main__`` (which would load it twice and warn).
"""

EXIT_PORT_IN_USE = 3  # the server could not bind its port
EXIT_STARTUP_FAILED = 1  # the settings cannot run (SGLang's flag checks, not enough memory)
EXIT_CRASH = 70  # an injected crash (crash_after fault)
PARENT_PID_ENV = "DRAFTGEN_SIM_PARENT_PID"  # set by a fleet: the process a server must not outlive
# A simulated server opens no TLS connection, but importing aiohttp loads the system's CA store (about 0.06
# CPU-seconds at every start, and the suites start hundreds): a fleet points its servers at an empty one.
NO_CA_STORE = {"SSL_CERT_FILE": "/dev/null", "SSL_CERT_DIR": "/dev/null"}
