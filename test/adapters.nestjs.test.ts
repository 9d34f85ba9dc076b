import { describeNest } from './support/nest-specifics.js';

describeNest('nest 12');
