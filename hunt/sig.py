"""Send SIGINT/SIGTERM to long-running zres commands, as a terminal's Ctrl-C would."""
import os, signal, subprocess, sys, time
cmds = [a.split() for a in sys.argv[1:]]
for sig in (signal.SIGINT, signal.SIGTERM):
    for cmd in cmds:
        p = subprocess.Popen([sys.executable, "-m", "zres", *cmd], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(2.5)
        p.send_signal(sig)
        try:
            out, _ = p.communicate(timeout=10)
            print(f"{sig.name} rc={p.returncode} {' '.join(cmd)}\n   ", out.strip().splitlines()[-2:])
        except subprocess.TimeoutExpired:
            p.kill(); print(f"HANG {sig.name} {' '.join(cmd)}")
