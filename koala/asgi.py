"""The ASGI entry: what `make run` and production serve (uvicorn koala.asgi:application).

Under ASGI the worker API's acquire (api.views.worker) waits as a coroutine, so an idle fleet
costs one open request per worker and no thread; the admin, console and exports run as before
(Django runs their sync views on threads). koala/wsgi.py stays for a WSGI server that serves
everything except the long-polling acquire.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "koala.settings")
application = get_asgi_application()
