"""The virtual clock: the server's scheduler (``scheduler``: availability asked at virtual times
(``availability``), the clock and the tasks in flight as one component, with a policy for
synchronous rounds and one for asynchronous steps), how long clients take (``durations``), what a
synchronous round keeps when time matters (``rounds``), the asynchronous server's queue of clients
in flight (``flight``), and the record of who was asked when (``events``). The ``clock`` section
(``params``) configures it; ``clock.kind: none`` (the default) is fedmpi without time: the
scheduler's untimed policy, rounds that take no time. docs/DESIGN.md ("The clock") says where it
sits. The package imports none of its modules: ``params`` and ``events`` stay torch-free for the
commands that only read result files."""
