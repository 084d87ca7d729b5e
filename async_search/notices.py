"""Notices: messages a server sends outside the order of its answers.

Kept apart from the connections that carry them so that what crosses a connection
(``wire``) and the connected functions that read it can both import it.
"""

from __future__ import annotations


class Notice:
    """A message a server sends to its clients outside the order of its answers
    (``Connection.notify``): a connected function never matches one to a request, but
    hands it to the callback given to ``listen``. Subclass it for each kind of notice.

    Example:
        >>> from async_search.connections import get_connected_functions
        >>> class Hello(Notice): pass
        >>> from async_search.queues import local_queue
        >>> (fn,), server = get_connected_functions(local_queue, 1, ordered=True)
        >>> seen = []; fn.listen(seen.append)
        >>> server.notify(Hello()); n = fn.flush(); type(seen[0]).__name__
        'Hello'
    """
