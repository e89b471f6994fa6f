"""Summarises a folded perf profile (inferno-collapse-perf output) of
`speedtap run` into docs/bench/speedtap-profile.txt: CPU by thread, a few
named buckets (inclusive), and the top frames by self time.

Usage: python3 docs/bench/profile_summary.py speedtap.folded
"""
import sys, re, collections
path = sys.argv[1]
tot = 0; incl = collections.Counter(); selfc = collections.Counter(); comm = collections.Counter()
def clean(f):
    f = re.sub(r'::h[0-9a-f]{16}$', '', f)
    f = re.sub(r'_\[[kj]\]$', '', f)
    return f
for line in open(path):
    stack, n = line.rstrip().rsplit(' ', 1); n = int(n); tot += n
    frames = [clean(f) for f in stack.split(';')]
    comm[frames[0]] += n
    selfc[frames[-1]] += n
    for f in set(frames[1:]):
        incl[f] += n
pct = lambda n: f"{100*n/tot:5.1f}%"
print(f"samples: {tot}")
print("\n== CPU by thread (speedtap-proxy = tokio runtime running the proxy; actix-rt|system = the metering arbiter running call actors; speedtap-actors = supervisor)")
for c, n in comm.most_common(): print(f"{pct(n)}  {c}")
buckets = [
 ("proxy: hyper server side (client connections)", r"hyper_util::server::conn::auto::Connection<.*Future>::poll$"),
 ("proxy: hyper client side (upstream connections)", r"UpgradeableConnection<.*Future>::poll$"),
 ("proxy: response tap (Observed::poll_frame)", r"speedtap::engine::proxy::tap::Observed<.*>::poll_frame$"),
 ("proxy: hand-off to the call actor (actix do_send)", r"^actix::address::channel::AddressSender<A>::do_send$"),
 ("proxy: idle timeout body wrapper", r"IdleTimeout<B> as http_body::Body>::poll_frame$"),
 ("kernel: writev (socket sends)", r"^__GI___writev$"),
 ("kernel/libc: socket reads", r"<&mio::net::tcp::stream::TcpStream as std::io::Read>::read$"),
 ("runtime: parking and epoll_wait", r"^epoll_wait$"),
 ("runtime: waking another thread (mio Waker / eventfd)", r"^mio::sys::unix::waker::Waker::wake$"),
 ("kernel: context switches (finish_task_switch)", r"^finish_task_switch"),
 ("metering: CallActor handling frames (one message per frame, before the batched hand-off)", r"CallActor as actix::handler::Handler<speedtap::engine::messages::Frame>>::handle$"),
 ("metering: CallActor draining its frame queue (the batched hand-off)", r"^speedtap::engine::call_actor::CallActor::drain_frames$"),
 ("metering: SSE framing + JSON decoding (StreamDecoder::feed)", r"^speedtap::decode::stream::StreamDecoder::feed$"),
 ("metering: serde_json Value parse of each event", r"serde_json::de::from_trait"),
 ("metering: token counting (o200k count_tokens)", r"O200kEstimator as speedtap::tokens::TokenEstimator>::count_tokens$"),
 ("metering: snapshot publish (CallMeter::publish)", r"^speedtap::meter::call::CallMeter::publish$"),
 ("supervisor: CallProgress handling", r"Supervisor as actix::handler::Handler<speedtap::engine::messages::CallProgress>>::handle$"),
 ("output: JSON lines to stdout (file write)", r"<&std::fs::File as std::io::Write>::write$"),
 ("store: SQLite writer", r"speedtap::store::writer"),
 ("startup: o200k tables build (one-off)", r"tiktoken_rs::singleton::o200k_base_singleton$"),
 ("allocator: malloc+free (self)", None),
 ("kernel: scheduler wake-ups and switches (self: finish_task_switch, _raw_spin_unlock_irq*, try_to_wake_up)", "SELF_SCHED"),
]
print("\n== Where the time goes (inclusive: the frame and everything it calls; buckets overlap)")
for name, rx in buckets:
    if rx == "SELF_SCHED":
        n = sum(v for k, v in selfc.items() if re.search(r"^(finish_task_switch|_raw_spin_unlock_irq|try_to_wake_up)", k))
    elif rx is None:
        n = sum(v for k, v in selfc.items() if re.search(r"^(malloc|_int_malloc|_int_free|cfree|free|malloc_consolidate|realloc|_int_realloc)(@.*)?$", k))
    else:
        r = re.compile(rx)
        n = max([v for k, v in incl.items() if r.search(k)] or [0])
    print(f"{pct(n)}  {name}")
print("\n== Top 30 frames by self time")
for f, n in selfc.most_common(30): print(f"{pct(n)}  {f[:140]}")
