"""Health verdicts of the failover controller, as pure rules. Never imports I/O libraries.

One module per signal, each a pure rule with its own table-driven tests: `heartbeat` (late, lost),
`xid` (NVIDIA's XID catalogue by required action), `gpu_signals` (XID, ECC, retired pages, heat),
`link_signals` (which hosts depend on a link, which problems take it out), `job_exits` (whose fault
an exit was; retries and flags). `decide` combines them: `decide(FailoverRequest) -> FailoverReply`.
`operator` is what an operator may say (recover a GPU, recover or drain a node):
`act(OperatorRequest) -> OperatorReply`.
"""
