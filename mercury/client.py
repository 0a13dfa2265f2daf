"""`from mercury.client import Client, AsyncClient`: the SDK under its historical name.

The SDK lives in its own top-level package, `mercury_client`, which imports no server
package so it can ship alone; this module only re-exports its public names for code
written against the older path.
"""

from mercury_client import *  # noqa: F403
from mercury_client import __all__ as __all__
