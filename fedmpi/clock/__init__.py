"""The virtual clock: how long clients take (``durations``), what a synchronous round keeps when
time matters (``rounds``), the asynchronous server's queue of clients in flight (``flight``), and
the record of who was asked when (``events``). The ``clock`` section (``params``) configures it;
``clock.kind: none`` (the default) is fedmpi without time: rounds take no time and nothing here
runs. docs/DESIGN.md ("The clock") says where it sits. The package imports none of its modules:
``params`` and ``events`` stay torch-free for the commands that only read result files."""
