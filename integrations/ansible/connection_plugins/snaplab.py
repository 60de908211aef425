# -*- coding: utf-8 -*-
# snaplab connection plugin for Ansible: tasks run in snaplab machines through the snaplab CLI,
# no sshd needed in the machine. Modelled on the lxd/incus connection plugins of
# community.general: exec for commands, cp for put_file/fetch_file.
from __future__ import annotations

DOCUMENTATION = r"""
name: snaplab
short_description: Run tasks in snaplab machines through the snaplab command
description:
  - Runs commands with C(snaplab exec) and moves files with C(snaplab cp), so a machine needs
    no sshd and no network address. Install by pointing C(ANSIBLE_CONNECTION_PLUGINS) (or
    C(connection_plugins) in ansible.cfg) at this directory.
author: snaplab
options:
  remote_addr:
    description:
      - The machine when I(snaplab_machine) is not set.
    default: inventory_hostname
    vars:
      - name: inventory_hostname
  snaplab_machine:
    description:
      - The machine, as snaplab names it (NAME, or SCENARIO/MACHINE for a scenario's machine);
        C(snaplab inventory) sets it for every host.
    vars:
      - name: snaplab_machine
  remote_user:
    description:
      - Run commands as this user of the machine (C(snaplab exec --user)); default its root.
    vars:
      - name: ansible_user
  executable:
    description:
      - The snaplab command.
    default: snaplab
    vars:
      - name: snaplab_executable
    env:
      - name: SNAPLAB_EXECUTABLE
"""

import subprocess

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.connection import ConnectionBase
from ansible.utils.display import Display

display = Display()


class Connection(ConnectionBase):
    """Commands and files through the snaplab CLI."""

    transport = "snaplab"
    has_pipelining = True
    default_user = None

    def _machine(self):
        return self.get_option("snaplab_machine") or self.get_option("remote_addr")

    def _snaplab(self, args, in_data=None):
        argv = [self.get_option("executable")] + args
        display.vvv("SNAPLAB: %s" % " ".join(argv), host=self._machine())
        try:
            p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as e:
            raise AnsibleConnectionFailure("cannot run %s: %s (is snaplab on PATH? set snaplab_executable)" % (argv[0], e))
        out, err = p.communicate(in_data)
        return p.returncode, out, err

    def _connect(self):
        super(Connection, self)._connect()
        self._connected = True
        return self

    def exec_command(self, cmd, in_data=None, sudoable=True):
        super(Connection, self).exec_command(cmd, in_data=in_data, sudoable=sudoable)
        args = ["exec", "-i"]
        user = self.get_option("remote_user")
        if user:
            args += ["--user", user]
        args += [self._machine(), "--", "/bin/sh", "-c", to_text(cmd)]
        rc, out, err = self._snaplab(args, in_data)
        # 125: snaplab itself failed (no such machine, it died): not the command's result
        if rc == 125:
            raise AnsibleConnectionFailure("snaplab exec in %s failed: %s" % (self._machine(), to_text(err).strip()))
        return rc, out, err

    def put_file(self, in_path, out_path):
        super(Connection, self).put_file(in_path, out_path)
        # -L: a symlinked file of a role is copied as the file it names, as ssh's sftp does
        rc, _, err = self._snaplab(["cp", "-L", "--", to_text(in_path), "%s:%s" % (self._machine(), to_text(out_path))])
        if rc not in (0, 1):
            raise AnsibleError("snaplab cp %s to %s:%s failed: %s" % (in_path, self._machine(), out_path, to_text(err).strip()))

    def fetch_file(self, in_path, out_path):
        super(Connection, self).fetch_file(in_path, out_path)
        # -L: what the path names, never a link a machine planted pointing at a host path
        rc, _, err = self._snaplab(["cp", "-L", "--", "%s:%s" % (self._machine(), to_text(in_path)), to_text(out_path)])
        if rc not in (0, 1):
            raise AnsibleError("snaplab cp %s:%s to %s failed: %s" % (self._machine(), in_path, out_path, to_text(err).strip()))

    def close(self):
        super(Connection, self).close()
        self._connected = False
