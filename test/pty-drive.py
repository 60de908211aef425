"""Drive a command on a real pseudo-terminal, as a person at a terminal would (test helper).

    python3 test/pty-drive.py STEPS.json -- ARGV...

STEPS is a list of ["send", text] | ["wait", regex] | ["resize", cols, rows] | ["sleep", s] |
["kill", "child" | "parent"] (SIGKILL the command, or the first child it started). Prints one
JSON line: the terminal's output, the exit status, whether the terminal's settings after are the
same as before (restored), and whether they had changed while it ran (wasRaw, at a kill step)."""
import fcntl, json, os, pty, re, select, struct, sys, termios, time

steps = json.load(open(sys.argv[1]))
argv = sys.argv[3:]
pid, fd = pty.fork()
if pid == 0:
    os.execvp(argv[0], argv)
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack('HHHH', 24, 80, 0, 0))
before = termios.tcgetattr(fd)  # the slave's settings, read through the master
during = None
out = b''


def read_for(t):
    global out
    end = time.time() + t
    while time.time() < end:
        r, _, _ = select.select([fd], [], [], max(0, end - time.time()))
        if not r:
            break
        try:
            b = os.read(fd, 65536)
        except OSError:  # EIO: every holder of the slave has gone
            return False
        if not b:
            return False
        out += b
    return True


timed_out = False
for step in steps:
    if step[0] == 'send':
        os.write(fd, step[1].encode())
    elif step[0] == 'sleep':
        read_for(step[1])
    elif step[0] == 'resize':
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack('HHHH', step[2], step[1], 0, 0))
    elif step[0] == 'kill':
        during = termios.tcgetattr(fd)
        kids = open(f'/proc/{pid}/task/{pid}/children').read().split()
        os.kill(int(kids[0]) if step[1] == 'child' else pid, 9)
    elif step[0] == 'wait':
        end = time.time() + 30
        while not re.search(step[1].encode(), out):
            if time.time() > end or not read_for(0.05):
                timed_out = timed_out or not re.search(step[1].encode(), out)
                break
deadline = time.time() + 20
while read_for(0.2) and time.time() < deadline:
    pass
# The master reads EIO once the last holder of the slave has closed it, and a process closes its
# files before it becomes a zombie (exit_files, then exit_notify): under load waitpid can still
# say "running" just after the EIO (seen as a `<defunct>` snaplab in the report of a "hang").
# So give an exit that is under way a few seconds before calling it hung.
grace = time.time() + 5
done, st = os.waitpid(pid, os.WNOHANG)
while done == 0 and time.time() < grace:
    time.sleep(0.02)
    done, st = os.waitpid(pid, os.WNOHANG)
hung = done == 0
ps = ''
if hung:  # still running with nothing left to do: say so rather than wait forever
    # what every process of ours and of the machine's was doing, for the report
    import subprocess
    ps = subprocess.run(['ps', '-eo', 'pid,ppid,pgid,sid,stat,wchan:28,args', '--forest'], capture_output=True, text=True).stdout
    ps = '\n'.join(l for l in ps.splitlines() if re.search(r'PID|snaplab|sh -l|sleep|bwrap|agent', l))
    os.kill(pid, 9)
    _, st = os.waitpid(pid, 0)
after = termios.tcgetattr(fd)
print(json.dumps({
    'output': out.decode('utf8', 'replace'),
    'status': os.waitstatus_to_exitcode(st),
    'restored': before == after,
    'wasRaw': during is not None and during != before,
    'waitTimedOut': timed_out,
    'hung': hung,
    'ps': ps,
}))
