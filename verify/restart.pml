/*
 * Vigil's restart protocol, checked exhaustively with Spin (docs/safety.md says what it covers and
 * what it leaves out). Two agent instances watch one node with one worker; the environment does,
 * at any moment, everything the world can: the worker recovers or hangs again, an operator stops
 * or restarts its container, the node lock's TTL runs out (outside the window the lock check
 * protects), the cooldown marker expires.
 *
 * Each instance runs the pipeline of agent/src/engine/restart.rs in its order: incident confirmed
 * and due -> lock (SET NX) -> logs and alert (slow: the world moves) -> revalidation (fresh record,
 * cooldown marker) -> compare-and-restart (same incarnation, running) -> breaker (atomic capped
 * increment) -> lock check (still ours, with TTL for the whole command) -> cooldown marker ->
 * command -> release (compare-and-delete).
 *
 * Mutants (each must be rejected): -DMUTANT_NO_REVALIDATE, -DMUTANT_NO_COMPARE, -DMUTANT_NO_LOCK,
 * -DMUTANT_BREAKER_FIRST (the breaker taken at pipeline start and never refunded).
 *
 * -DLOCK_EXPIRES_ANYWHERE lets the lock go even inside the window the lock check protects (a
 * pause longer than the margin, a Redis failover that forgot it): then a double restart is
 * reachable, and only the breaker bounds it (docs/safety.md). check-model.sh shows both.
 */

#define CAP 2        /* safety.breaker_per_day */
#define MAXINC 4     /* incarnations explored */

bool hung = true;    /* ground truth: the worker is hung */
byte inc = 0;        /* the container's incarnation */
bool running = true; /* the container runs (not stopped or paused by someone) */
byte lock = 0;       /* 0: free, else the holder (1 or 2) */
bool cooldown = false;
byte breaker = 0;    /* restarts counted today */
byte restarts = 0;   /* ghost: restarts that ran */
byte held = 0;       /* ghost: breaker units taken by runs whose command has not run yet */
byte serial = 0;     /* ghost: agent restarts so far */
bool protected[3];   /* holder between its lock check and the end of its command */

inline release_lock() {
  atomic { if :: lock == me -> lock = 0 :: else -> skip fi }
}

proctype Agent(byte me) {
  byte seen;         /* the incarnation decided on */
  byte seen_serial;  /* agent restarts when this one compared */
  bool took;
  bool counted;
  bool reval_ok;     /* ghost: hung and no cooldown marker at the revalidation */
  bool cmp_ok;       /* ghost: the decided incarnation, running, at the compare */
  do
  :: restarts >= CAP + 1 || inc >= MAXINC - 1 -> break
  :: else ->
     /* Decision: the shared record says hung, no cooldown marker (this is not our restart). */
     atomic {
       if
       :: hung && !cooldown && running -> seen = inc
       :: else -> goto next
       fi
     }
     counted = false;
#ifdef MUTANT_BREAKER_FIRST
     atomic { if :: breaker < CAP -> breaker++; held++; counted = true :: else -> goto next fi }
#endif
#ifndef MUTANT_NO_LOCK
     atomic { if :: lock == 0 -> lock = me; took = true :: else -> took = false fi }
     if :: !took -> goto done :: else -> skip fi;
#endif
     /* Logs and the restart alert happen here: slow, the world moves. */
     atomic {
       reval_ok = hung && !cooldown;
#ifndef MUTANT_NO_REVALIDATE
       if :: !reval_ok -> goto done :: else -> skip fi
#endif
     }
     atomic {
       cmp_ok = inc == seen && running;
       seen_serial = serial;
#ifndef MUTANT_NO_COMPARE
       if :: !cmp_ok -> goto done :: else -> skip fi
#endif
     }
#ifndef MUTANT_BREAKER_FIRST
     atomic { if :: breaker < CAP -> breaker++; held++; counted = true :: else -> goto done fi }
#endif
#ifndef MUTANT_NO_LOCK
     atomic {
       if
       :: lock == me -> protected[me] = true
       :: else -> breaker--; held--; counted = false; goto done   /* refund: nothing will run */
       fi
     }
#endif
     cooldown = true;   /* the "this is me" marker goes in before the command */
     atomic {
       /* The command: every safety property, at the moment it runs. */
       assert(reval_ok);             /* only a worker hung at the revalidation */
       assert(cmp_ok);               /* only the incarnation decided on, running at the compare */
#ifndef ALLOW_DOUBLE
       assert(serial == seen_serial);/* no other agent restarted it since: never twice */
#endif
       assert(counted);              /* never outside the breaker */
       restarts++; serial++; held--; counted = false;
       inc++; running = true; hung = false;   /* the new incarnation boots */
       protected[me] = false
     }
done:
     release_lock();
next:
     /* A run that did not reach the command holds no breaker unit. */
     assert(!counted);
  od
}

/* The world, at any moment. */
active proctype World() {
  do
  :: hung = false                                     /* the worker recovers */
  :: hung = true                                      /* ...or hangs (again) */
  :: running = false                                  /* an operator stops (or pauses) it */
  :: inc < MAXINC - 1 -> atomic { inc++; running = true; hung = false; cooldown = true }
                                                      /* an operator restarts it: a new
                                                         incarnation, booting (the agents'
                                                         incarnation tracking marks it) */
#ifdef LOCK_EXPIRES_ANYWHERE
  :: atomic { lock != 0 -> lock = 0 }                 /* a pause past the margin, a failover */
#else
  :: atomic { lock != 0 && !protected[lock] -> lock = 0 }
                                                      /* the lock's TTL runs out */
#endif
  :: cooldown = false                                 /* the cooldown expires */
  :: break
  od
}

init {
  atomic { run Agent(1); run Agent(2) }
}

/* The caps, whatever the interleaving: no more restarts than the breaker allows, and the
 * breaker counts exactly the restarts that ran plus the units held for a command about to run. */
active proctype Caps() {
  do
  :: atomic { assert(breaker <= CAP); assert(breaker == restarts + held) }
  od
}
